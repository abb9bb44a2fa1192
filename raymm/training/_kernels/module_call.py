"""One shared module called with parameter tensors given per call."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from torch import Tensor, nn


class ModuleCall:
    """Calls one shared module with the parameter tensors given per call in place of its own
    (what `torch.func.functional_call` does, vmappable alike). The module's parameters are
    plain attributes of a handful of submodules, so swapping them in its `_parameters` and
    back is all it takes. The sequential path calls it once per minibatch of every device, so
    it must cost what calling the module itself costs, which `functional_call` (re-walking the
    module for tied weights on every call) does not (docs/performance.md, "Smaller
    mechanisms"). Buffers stay the module's own."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        named = list(model.named_parameters(remove_duplicate=False))
        if len({id(p) for _, p in named}) != len(named):
            raise ValueError("ModuleCall needs a module without tied parameters")
        self.slots: dict[str, tuple[nn.Module, str]] = {}
        for name, _ in named:
            owner, _, attr = name.rpartition(".")
            self.slots[name] = (model.get_submodule(owner), attr)

    def __call__(self, params: Mapping[str, Tensor], *args: Any, **kwargs: Any) -> Any:
        return self.run(params, self.model, *args, **kwargs)

    def run(self, params: Mapping[str, Tensor], fn: Callable[..., Any], *args: Any,
            **kwargs: Any) -> Any:
        """`fn(*args, **kwargs)` (the module or one of its parts) with `params` swapped in."""
        saved = []
        try:
            for name, value in params.items():
                mod, attr = self.slots[name]
                saved.append((mod, attr, mod._parameters[attr]))
                mod._parameters[attr] = value  # type: ignore[assignment]  # a plain tensor
            return fn(*args, **kwargs)
        finally:
            for mod, attr, own in reversed(saved):
                mod._parameters[attr] = own
