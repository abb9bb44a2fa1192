"""A tiny typed registry: policies register a class under a name; configs name them.

Each registered class carries a pydantic `Params` model, so a scenario's policy section is
checked against it before anything runs, and the class is built from the validated params.
A registry holds subclasses of one seam (`raymm.protocol.seams`), so every hook has a default.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

from pydantic import BaseModel

from raymm.config.schema import Scenario
from raymm.protocol.seams import Aggregator, Objective, Policy, Schedule, Selector

T = TypeVar("T", bound=Policy)


class Registry(Generic[T]):
    """Name -> subclass of `base`. `kind` appears in error messages ("unknown selection policy
    ...")."""

    def __init__(self, kind: str, base: type[Any]) -> None:  # an abstract seam: not type[T]
        self.kind = kind
        self.base = base
        self._classes: dict[str, type[T]] = {}
        self._params: dict[str, type[BaseModel]] = {}

    def register(self, name: str) -> Callable[[type[T]], type[T]]:
        def deco(cls: type[T]) -> type[T]:
            if not (isinstance(cls, type) and issubclass(cls, self.base)):
                raise TypeError(f"{self.kind} {name!r} must subclass raymm.protocol.seams."
                                f"{self.base.__name__}, which declares every hook it may have")
            if name in self._classes and self._classes[name] is not cls:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            self._classes[name] = cls
            self._params[name] = cls.Params  # `NoParams` unless the class (or a base) says
            return cls

        return deco

    def names(self) -> list[str]:
        return sorted(self._classes)

    def __contains__(self, name: object) -> bool:
        return name in self._classes

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def get(self, name: str) -> type[T]:
        return self._classes[name]

    def params_model(self, name: str) -> type[BaseModel]:
        return self._params[name]

    def build(self, name: str, params: BaseModel | dict[str, Any] | None = None) -> T:
        cls, model = self._classes[name], self._params[name]
        if params is None:
            params = model()
        elif isinstance(params, dict):
            params = model(**params)
        return cls(params)  # type: ignore[call-arg]  # every policy takes its Params


SELECTORS: Registry[Selector] = Registry("selection policy", Selector)
AGGREGATORS: Registry[Aggregator] = Registry("aggregation policy", Aggregator)
SCHEDULES: Registry[Schedule] = Registry("schedule", Schedule)
OBJECTIVES: Registry[Objective] = Registry("objective", Objective)

#: the scenario section each registry serves
POLICY_SECTIONS: dict[str, Registry[Any]] = {
    "selection": SELECTORS, "aggregation": AGGREGATORS, "schedule": SCHEDULES,
    "objective": OBJECTIVES,
}


def policy_params(sc: Scenario, section: str) -> BaseModel:
    """The validated parameter model of a scenario's policy section."""
    spec = getattr(sc, section)
    registry = POLICY_SECTIONS[section]
    return registry.params_model(spec.name)(**spec.params())
