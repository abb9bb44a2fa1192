"""How many devices each DeviceActor hosts, from the cluster's resources.

Pure functions of numbers (testable without Ray). A packing that cannot fit the cluster fails
fast with the numbers, rather than leaving actors pending forever. Memory counts like CPUs:
each actor asks for its estimated memory (`raymm.device.footprint`, or the MiB of
`execution.actor.memory`), which depends on how many devices it hosts, so `auto` takes the
most actors whose memory fits alongside the CPUs, and a fixed `devices_per_actor` whose
actors need more than the cluster's `memory` is refused with the estimate's parts.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from raymm.config.schema import ActorSpec
from raymm.device.footprint import Footprint, gib
from raymm.errors import RaymmError
from raymm.protocol.combine import BLOCK


class ResourceError(RaymmError):
    """The requested actors need more resources than the cluster has."""


@dataclass(frozen=True)
class Packing:
    """Actors host contiguous id ranges: `starts[i]` is actor i's first device (empty: every
    `devices_per_actor` ids); `devices_per_actor` is the largest actor's size."""

    devices_per_actor: int
    num_actors: int
    starts: tuple[int, ...] = ()

    def ranges(self, n_devices: int) -> list[np.ndarray]:
        """Each actor's device ids."""
        starts = self.starts or tuple(range(0, n_devices, self.devices_per_actor))
        ends = (*starts[1:], n_devices)
        return [np.arange(s, e) for s, e in zip(starts, ends)]


class ActorMemory:
    """Bytes one DeviceActor asks for, by the devices it hosts: the footprint's estimate
    (`memory: auto`), a fixed number of MiB, or nothing."""

    def __init__(self, actor: ActorSpec, footprint: Footprint | None) -> None:
        self.footprint = footprint if actor.memory == "auto" else None
        self.fixed = 0 if actor.memory == "auto" else int(float(actor.memory) * 2**20)

    def __call__(self, devices: int) -> int:
        return self.footprint.bytes(devices) if self.footprint is not None else self.fixed

    def describe(self, devices: int) -> str:
        if self.footprint is not None:
            return self.footprint.describe(devices)
        return f"{gib(self.fixed)} (execution.actor.memory)"


NO_MEMORY = ActorMemory(ActorSpec(memory=0), None)


def actor_demand(actor: ActorSpec, memory: int = 0) -> dict[str, float]:
    """One DeviceActor's resources; `memory` in bytes (0: not asked for)."""
    demand = {"CPU": actor.num_cpus, "GPU": actor.num_gpus, **actor.resources,
              "memory": float(memory)}
    return {k: v for k, v in demand.items() if v > 0}


def actor_capacity(actor: ActorSpec, resources: Mapping[str, float]) -> int:
    """How many DeviceActors of this shape fit in `resources` at once."""
    fits = [math.floor(resources.get(k, 0.0) / v + 1e-9) for k, v in actor_demand(actor).items()]
    return min(fits) if fits else 10**9


def plan_packing(n_devices: int, devices_per_actor: int | str, actor: ActorSpec,
                 resources: Mapping[str, float],
                 memory: ActorMemory = NO_MEMORY) -> Packing:
    """`auto`: as many actors as fit (at most one per device), devices spread evenly, with
    the boundaries on whole blocks of ids (`block_aligned`). An int: ceil(n / int) actors,
    which must all fit. `memory(devices)`: the bytes an actor of that many devices asks for;
    the actors' sum must fit the cluster's `memory` too."""
    capacity = actor_capacity(actor, resources)
    if devices_per_actor == "auto":
        if capacity < 1:
            _fail(1, actor, resources)
        n_actors = max(1, min(n_devices, capacity))
        packing = _auto(n_devices, n_actors)
        while packing.num_actors > 1 and not _memory_fits(packing, n_devices, memory,
                                                          resources):
            # fewer actors: fewer bases and model copies to hold
            packing = _auto(n_devices, packing.num_actors - 1)
    else:
        per = int(devices_per_actor)
        n_actors = math.ceil(n_devices / per)
        if n_actors > capacity:
            _fail(n_actors, actor, resources)
        packing = Packing(per, n_actors)
    if not _memory_fits(packing, n_devices, memory, resources):
        _fail_memory(packing, n_devices, memory, resources)
    return packing


def _auto(n_devices: int, n_actors: int) -> Packing:
    if n_actors < 2:
        return Packing(n_devices, 1)
    aligned = block_aligned(n_devices, n_actors)
    if aligned is not None:
        return aligned
    per = math.ceil(n_devices / n_actors)
    return Packing(per, math.ceil(n_devices / per))


def memory_needed(packing: Packing, n_devices: int, memory: ActorMemory) -> int:
    """Bytes all the packing's actors ask for together."""
    return sum(memory(len(ids)) for ids in packing.ranges(n_devices))


def _memory_fits(packing: Packing, n_devices: int, memory: ActorMemory,
                 resources: Mapping[str, float]) -> bool:
    need = memory_needed(packing, n_devices, memory)
    return need == 0 or need <= resources.get("memory", 0.0) + 1


def _fail_memory(packing: Packing, n_devices: int, memory: ActorMemory,
                 resources: Mapping[str, float]) -> None:
    n, per = packing.num_actors, packing.devices_per_actor
    need = memory_needed(packing, n_devices, memory)
    raise ResourceError(
        f"execution: {n} DeviceActor(s) need memory={gib(need)}"
        f" (the largest: {memory.describe(per)}) but the cluster has "
        f"memory={gib(resources.get('memory', 0.0))}; fewer actors need less (one base each: "
        "raise devices_per_actor), data memory-mapped from files is not resident "
        "(raymm.data.mapped), or add nodes; execution.actor.memory sets the request by hand")


def block_aligned(n_devices: int, n_actors: int) -> Packing | None:
    """Boundaries at the multiples of `combine.BLOCK` nearest to the even split; None when an
    actor would get no device or the largest one would exceed the even share by over 10%.
    An actor that hosts whole blocks sends each block's pre-summed vector
    (`raymm.protocol.combine`); a block cut by a boundary travels as one row per selected device
    instead: at 1,000 devices on two actors that was a quarter of a block's senders as rows, ~0.45
    MB through Ray's object store rather than inline."""
    if n_actors < 2:
        return None
    starts = tuple(round(i * n_devices / n_actors / BLOCK) * BLOCK for i in range(n_actors))
    sizes = np.diff([*starts, n_devices])
    if sizes.min() < 1 or sizes.max() > 1.1 * math.ceil(n_devices / n_actors):
        return None
    return Packing(int(sizes.max()), n_actors, starts)


def _fail(n_actors: int, actor: ActorSpec, resources: Mapping[str, float]) -> None:
    demand = actor_demand(actor)
    need = ", ".join(f"{k}={v * n_actors:g}" for k, v in demand.items())
    have = ", ".join(f"{k}={resources.get(k, 0.0):g}" for k in demand)
    raise ResourceError(
        f"execution: {n_actors} DeviceActor(s) need {need} but the cluster has {have}; "
        "raise devices_per_actor (or use auto), lower execution.actor resources, or add nodes")
