"""A tiny typed registry: policies register a class under a name; configs name them.

Each registered class carries a pydantic `Params` model, so a scenario's policy section is
checked against it before anything runs, and the class is built from the validated params.
A registry holds subclasses of one seam (`raymm.protocol.seams`), so every hook has a default.

Named methods (presets: the scenario keys a `method:` stands for) are registered here too,
with `register_preset`: raymm's own in `policies/presets.py`, a plugin's in its own module.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Generic, TypeVar

from pydantic import BaseModel

from raymm.config.schema import Scenario
from raymm.protocol.seams import Aggregator, Objective, Policy, Schedule, Selector

T = TypeVar("T", bound=Policy)


class Registry(Generic[T]):
    """Name -> subclass of `base`. `kind` appears in error messages ("unknown selection policy
    ...")."""

    def __init__(self, kind: str, base: type[Policy]) -> None:  # an abstract seam: not type[T]
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

    def unregister(self, name: str) -> None:
        """Forget `name` (a plugin whose import failed half-way leaves nothing behind)."""
        self._classes.pop(name, None)
        self._params.pop(name, None)

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
POLICY_SECTIONS: dict[str, Registry[Selector] | Registry[Aggregator] | Registry[Schedule]
                      | Registry[Objective]] = {
    "selection": SELECTORS, "aggregation": AGGREGATORS, "schedule": SCHEDULES,
    "objective": OBJECTIVES,
}


def policy_params(sc: Scenario, section: str) -> BaseModel:
    """The validated parameter model of a scenario's policy section."""
    spec = getattr(sc, section)
    registry = POLICY_SECTIONS[section]
    return registry.params_model(spec.name)(**spec.params())


#: named methods: preset name -> the scenario keys it sets (a scenario's own keys override
#: them). Filled by `policies/presets.py` and by plugins through `register_preset`.
PRESETS: dict[str, dict[str, Any]] = {}
#: the methods `raymm sweep --methods all` runs: every preset registered as a method (ablations
#: are left out)
METHODS: list[str] = []
#: what a preset name may look like: it becomes part of run names (`<scenario>_<method>`)
PRESET_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def register_preset(name: str, spec: Mapping[str, Any], *, ablation: bool = False) -> None:
    """Register the named method `name`: the scenario keys it sets, as a scenario file writes
    them (`{"selection": {"name": ...}, "aggregation": {...}, "training": {...}}`). It joins
    `raymm sweep --methods all` unless it is an `ablation`. The spec is copied; its policies
    are looked up when a scenario uses it, so it may name policies registered later."""
    if not isinstance(name, str) or not PRESET_NAME.fullmatch(name):
        raise ValueError(f"preset name {name!r}: use letters, digits, '_', '.' and '-' "
                         "(at most 64, starting with a letter or digit)")
    if not isinstance(spec, Mapping):
        raise TypeError(f"preset {name!r} must be a mapping of scenario keys, got "
                        f"{type(spec).__name__}")
    unknown = sorted(set(spec) - (set(Scenario.model_fields) - {"method", "name"}))
    if unknown:
        raise ValueError(f"preset {name!r}: {', '.join(map(repr, unknown))} cannot be set by a "
                         "preset (it sets sections of a scenario such as selection, "
                         "aggregation, schedule, objective, model, training, eval)")
    keys = copy.deepcopy(dict(spec))
    if name in PRESETS and PRESETS[name] != keys:
        raise ValueError(f"preset {name!r} is registered twice")
    PRESETS[name] = keys
    if not ablation and name not in METHODS:
        METHODS.append(name)


def unregister_preset(name: str) -> None:
    """Forget preset `name` (see `Registry.unregister`)."""
    PRESETS.pop(name, None)
    if name in METHODS:
        METHODS.remove(name)
