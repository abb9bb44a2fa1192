"""What a lock-step program is, as plain data the trainer and its steps share: the devices'
requests, a trained chunk's rows (`ChunkRun`), the program as planned before its first step
(`Program`) and how its minibatches are drawn (`Feed`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor

from raymm.training.local_update import Params


class Request(NamedTuple):
    """One selected device's work this round, as the host would pass it to `SequentialTrainer`
    (a NamedTuple: a host builds one per selected device and round)."""

    device: int
    indices: np.ndarray
    held: np.ndarray
    groups: tuple[str, ...]
    local: np.ndarray | None
    #: the vectors the device loads before training (`exchange.start_vectors`); None: broadcast
    start: dict[str, np.ndarray] | None = None
    #: what the device kept from earlier rounds, for the objective's hooks
    state: dict[str, np.ndarray] | None = None


@dataclass(frozen=True)
class ChunkRun:
    """One lock-step program's devices, trained: every device's flat vectors as rows of one
    matrix per group, in the chunk's order (most steps first, then by id)."""

    reqs: list[Request]
    sources: list[dict[str, np.ndarray]]   # each device's starting vectors (`_sources`)
    groups: list[str]                      # every group a device trains (each: `reqs[i].groups`)
    flat: dict[str, np.ndarray]            # group (and LOCAL with an adapter) -> float32 [G, P]
    loss: np.ndarray                       # float64 [G]: mean minibatch loss
    steps: np.ndarray                      # int [G]: optimizer steps taken
    mean_grads: dict[str, np.ndarray] | None

    def devices(self) -> np.ndarray:
        return np.array([r.device for r in self.reqs], np.int64)


@dataclass
class Program:
    """One lock-step program as planned before its first step (`LockstepTrainer._plan`)."""

    reqs: list[Request]
    rnd: int
    groups: list[str]                   # the groups trained, stacked per device
    names: list[str]                    # their parameters (and the adapter's)
    sources: list[dict[str, np.ndarray]]   # each device's starting vectors (`_sources`)
    params: Params                      # trained: [G, ...] starting values
    anchor: Params                      # the same, as received (the proximal term's anchor)
    shared: Params                      # untrained, one tensor for every device
    dev_frozen: Params                  # untrained but per device: [G, ...]
    local_t: Params                     # the objective's device tensors, stacked
    helds: np.ndarray                   # bool [G, M]: the sensors each device holds
    per_held: list[tuple[str, ...]]     # the same by name, per device
    held_t: Tensor                      # the same as float, on the accelerator
    held_names: tuple[str, ...]         # sensors some device holds
    keeps: dict[str, Tensor]            # per parameter not every device trains (`_keeps`)
    sizes: np.ndarray                   # samples per device
    own_steps: np.ndarray               # steps per epoch per device, most first
    training: list[int]                 # per step of an epoch: the devices (a prefix) in it
    unread: dict[str, int]              # sensors whose encoders are not run -> width

    @property
    def indices(self) -> list[np.ndarray]:
        """Each device's sample indices."""
        return [r.indices for r in self.reqs]

    @property
    def steps(self) -> int:
        """Steps per epoch of the longest device."""
        return int(self.own_steps[0])


@dataclass
class Feed:
    """How a program's minibatches are drawn (`LockstepTrainer._feed`)."""

    weight: Tensor                                  # [G, steps, B]: 1 real row, 0 padding
    augment: Callable[..., Any] | None              # the objective's, where it draws
    data_aug: Callable[..., Any] | None             # the dataset's
    aug_gens: list[torch.Generator]                 # the dataset augmentation's streams
    gens: list[torch.Generator] = field(default_factory=list)   # per epoch draws; [] = drawn
    all_rows: list[Tensor] = field(default_factory=list)   # every epoch's rows, drawn at once
    frozen: list[str] = field(default_factory=list)        # sensors with round-long embeddings
    positions: list[Tensor] = field(default_factory=list)  # per epoch: samples' positions
    gathered: list[str] = field(default_factory=list)      # sensors whose inputs are gathered
