"""A tiny typed registry: policies register a class under a name; configs name them.

Each registered class carries a pydantic `Params` model, so a scenario's policy section is
checked against it before anything runs, and the class is built from the validated params.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ConfigDict

T = TypeVar("T")


class NoParams(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Registry(Generic[T]):
    """Name -> class. `kind` appears in error messages ("unknown selection policy ...")."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._classes: dict[str, type] = {}
        self._params: dict[str, type[BaseModel]] = {}

    def register(self, name: str) -> Callable[[type], type]:
        def deco(cls: type) -> type:
            if name in self._classes and self._classes[name] is not cls:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            # a class without parameters takes (and is given, as its `Params`) the empty model
            model: type[BaseModel] = getattr(cls, "Params", NoParams)
            cls.Params = model  # type: ignore[attr-defined]
            self._classes[name] = cls
            self._params[name] = model
            return cls

        return deco

    def names(self) -> list[str]:
        return sorted(self._classes)

    def __contains__(self, name: object) -> bool:
        return name in self._classes

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def get(self, name: str) -> type:
        return self._classes[name]

    def params_model(self, name: str) -> type[BaseModel]:
        return self._params[name]

    def build(self, name: str, params: BaseModel | dict[str, Any] | None = None) -> T:
        cls, model = self._classes[name], self._params[name]
        if params is None:
            params = model()
        elif isinstance(params, dict):
            params = model(**params)
        return cls(params)  # type: ignore[no-any-return]


SELECTORS: Registry[Any] = Registry("selection policy")
AGGREGATORS: Registry[Any] = Registry("aggregation policy")
SCHEDULES: Registry[Any] = Registry("schedule")
OBJECTIVES: Registry[Any] = Registry("objective")
