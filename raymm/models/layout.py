"""Flat float32 vectors per parameter group, and loading them back into a module."""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from raymm.models.network import LOCAL


@dataclass(frozen=True)
class Slot:
    name: str
    shape: tuple[int, ...]
    start: int
    stop: int


class GroupLayout:
    """Where each parameter sits in its group's flat vector (stable: named_parameters order)."""

    def __init__(self, model: nn.Module) -> None:
        slots: dict[str, list[Slot]] = {}
        sizes: dict[str, int] = {}
        for name, p in model.named_parameters():
            g = model.group_of(name)  # type: ignore[operator]
            start = sizes.get(g, 0)
            slots.setdefault(g, []).append(Slot(name, tuple(p.shape), start, start + p.numel()))
            sizes[g] = start + p.numel()
        self.slots = slots
        self.sizes = sizes
        # name -> parameter per module, built once: walking the module tree on every load and
        # flatten cost ~7 us each, per device, per round (parameters are only updated in place)
        self._named: weakref.WeakKeyDictionary[nn.Module, dict[str, nn.Parameter]] = \
            weakref.WeakKeyDictionary()

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "_named"}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._named = weakref.WeakKeyDictionary()

    def params(self, model: nn.Module) -> dict[str, nn.Parameter]:
        named = self._named.get(model)
        if named is None:
            named = self._named[model] = dict(model.named_parameters())
        return named

    @property
    def groups(self) -> list[str]:
        """Groups that travel (every group but the device-local one)."""
        return [g for g in self.slots if g != LOCAL]

    def nbytes(self, group: str) -> int:
        return 4 * self.sizes[group]

    def flatten(self, model: nn.Module, groups: list[str] | None = None) -> dict[str, np.ndarray]:
        params = self.params(model)
        out = {}
        for g in groups if groups is not None else list(self.slots):
            out[g] = torch.cat([params[s.name].detach().reshape(-1) for s in self.slots[g]]
                               ).cpu().numpy().astype(np.float32, copy=True)
        return out

    def load(self, model: nn.Module, flat: dict[str, np.ndarray]) -> None:
        """Copy group vectors into the module's parameters (no autograd history)."""
        params = self.params(model)
        with torch.no_grad():
            for g, vec in flat.items():
                t = torch.from_numpy(np.ascontiguousarray(vec, dtype=np.float32))
                for s in self.slots[g]:
                    params[s.name].copy_(t[s.start:s.stop].view(s.shape))

    def names(self, groups: list[str]) -> list[str]:
        return [s.name for g in groups for s in self.slots.get(g, [])]
