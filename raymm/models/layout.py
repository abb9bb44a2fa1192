"""Flat float32 vectors per parameter group, and loading them back into a module.

A group's vector holds its parameters and then its floating-point buffers (batch norm's
running statistics) when they travel (`model.buffers: average`: averaged with their group).
With `model.buffers: local` they form the group `buffers` instead, which never travels: each
device keeps its own vector (FedBN).
With `model.private` the blocks it names (task head, fusion layer, FDARN's private branch)
form the group `private`: trained like the others, but kept on each device and never
exchanged (BLOSSOM's PH/PHF, FDARN).
Integer buffers (batch norm's step count) never travel: loading a group puts them back to
their initial value, so nothing depends on how many devices a process trained.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from raymm.models.network import LOCAL, MultimodalNet, RaymmNet
from raymm.units import FLOAT_BYTES

#: the group of a device's own batch-norm statistics (`model.buffers: local`): kept, never sent
BUFFERS = "buffers"
#: the group of the blocks each device keeps and trains as its own (`model.private`)
PRIVATE = "private"
#: groups that never travel: the adapter, a device's own statistics, its private blocks
DEVICE_KEPT = (LOCAL, BUFFERS, PRIVATE)


def private_blocks(model: nn.Module) -> tuple[str, ...]:
    """The blocks `model.private` keeps on each device; they are blocks of raymm's own network
    (validation refuses the key with another factory)."""
    return tuple(model.spec.private) if isinstance(model, MultimodalNet) else ()


def block_of(model: RaymmNet, name: str) -> str | None:
    """The block of a parameter (or buffer) `model.private` may name: `head` = the task head,
    under logit fusion every sensor's head (then the task's classifiers); `fusion` = the fusion
    layer; `branch` = the private network beside the shared one (FDARN); None for the rest
    (encoders, auxiliary heads beside a fusion layer, the adapter)."""
    top = name.partition(".")[0]
    if top == "branch":
        return "branch"
    if top == "head" or (top == "heads" and model.fusion is None):
        return "head"
    return "fusion" if top == "fusion" else None


@dataclass(frozen=True)
class Slot:
    name: str
    shape: tuple[int, ...]
    start: int
    stop: int
    #: a buffer (running statistics), not a trained parameter
    buffer: bool = False


class GroupLayout:
    """Where each parameter (then each travelling buffer) sits in its group's flat vector
    (stable: named_parameters order, then named_buffers order)."""

    def __init__(self, model: RaymmNet, buffers: str = "average") -> None:
        slots: dict[str, list[Slot]] = {}
        sizes: dict[str, int] = {}
        if buffers not in ("average", "local"):
            raise ValueError(f"model.buffers: {buffers!r} is not supported")
        floats = [(n, b) for n, b in model.named_buffers() if b.is_floating_point()]
        params = {n for n, _ in model.named_parameters()}
        private = private_blocks(model)   # `model.private`
        for name, p in [*model.named_parameters(), *floats]:
            g = BUFFERS if buffers == "local" and name not in params else \
                PRIVATE if private and block_of(model, name) in private else \
                model.group_of(name)
            start = sizes.get(g, 0)
            slots.setdefault(g, []).append(Slot(name, tuple(p.shape), start, start + p.numel(),
                                                buffer=name not in params))
            sizes[g] = start + p.numel()
        self.slots = slots
        self.sizes = sizes
        #: integer buffers and their initial values, restored whenever a group is loaded
        self._counters = {n: b.detach().clone() for n, b in model.named_buffers()
                          if not b.is_floating_point()}
        # name -> parameter per module, built once rather than walking the module tree on every
        # load and flatten, per device and round (parameters are only updated in place;
        # docs/performance.md, "Smaller mechanisms")
        self._named: weakref.WeakKeyDictionary[
            nn.Module, tuple[dict[str, nn.Parameter], dict[str, torch.Tensor]]] = \
            weakref.WeakKeyDictionary()

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "_named"}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._named = weakref.WeakKeyDictionary()

    def params(self, model: nn.Module) -> dict[str, nn.Parameter]:
        """The module's trained parameters by name."""
        return self._lookup(model)[0]

    def tensors(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """The module's parameters and buffers by name (what a group's vector holds)."""
        return self._lookup(model)[1]

    def _lookup(self, model: nn.Module
                ) -> tuple[dict[str, nn.Parameter], dict[str, torch.Tensor]]:
        named = self._named.get(model)
        if named is None:
            params = dict(model.named_parameters())
            named = self._named[model] = (params, {**dict(model.named_buffers()), **params})
        return named

    @property
    def groups(self) -> list[str]:
        """Groups that travel (every group but the device-kept ones: adapter, buffers,
        private blocks)."""
        return [g for g in self.slots if g not in DEVICE_KEPT]

    def nbytes(self, group: str) -> int:
        return FLOAT_BYTES * self.sizes[group]

    def flatten(self, model: nn.Module, groups: list[str] | None = None) -> dict[str, np.ndarray]:
        params = self.tensors(model)
        out = {}
        for g in groups if groups is not None else list(self.slots):
            out[g] = torch.cat([params[s.name].detach().reshape(-1) for s in self.slots[g]]
                               ).cpu().numpy().astype(np.float32, copy=True)
        return out

    def load(self, model: nn.Module, flat: dict[str, np.ndarray]) -> None:
        """Copy group vectors into the module's parameters and travelling buffers (no autograd
        history); integer buffers go back to their initial values."""
        params = self.tensors(model)
        with torch.no_grad():
            for g, vec in flat.items():
                t = torch.from_numpy(np.ascontiguousarray(vec, dtype=np.float32))
                for s in self.slots[g]:
                    params[s.name].copy_(t[s.start:s.stop].view(s.shape))
            for name, initial in self._counters.items():
                params[name].copy_(initial)

    def names(self, groups: list[str]) -> list[str]:
        """The trained parameters' names of `groups` (buffers excluded)."""
        return [s.name for g in groups for s in self.slots.get(g, []) if not s.buffer]
