"""How many devices each DeviceActor hosts, from the cluster's resources.

Pure functions of numbers (testable without Ray). A packing that cannot fit the cluster fails
fast with the numbers, rather than leaving actors pending forever.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from raymm.config import ActorSpec
from raymm.errors import RaymmError


class ResourceError(RaymmError):
    """The requested actors need more resources than the cluster has."""


@dataclass(frozen=True)
class Packing:
    devices_per_actor: int
    num_actors: int


def actor_demand(actor: ActorSpec) -> dict[str, float]:
    demand = {"CPU": actor.num_cpus, "GPU": actor.num_gpus, **actor.resources}
    return {k: v for k, v in demand.items() if v > 0}


def actor_capacity(actor: ActorSpec, resources: Mapping[str, float]) -> int:
    """How many DeviceActors of this shape fit in `resources` at once."""
    fits = [math.floor(resources.get(k, 0.0) / v + 1e-9) for k, v in actor_demand(actor).items()]
    return min(fits) if fits else 10**9


def plan_packing(n_devices: int, devices_per_actor: int | str, actor: ActorSpec,
                 resources: Mapping[str, float]) -> Packing:
    """`auto`: as many actors as fit (at most one per device), devices spread evenly.
    An int: ceil(n / int) actors, which must all fit."""
    capacity = actor_capacity(actor, resources)
    if devices_per_actor == "auto":
        if capacity < 1:
            _fail(1, actor, resources)
        n_actors = max(1, min(n_devices, capacity))
        per = math.ceil(n_devices / n_actors)
        return Packing(per, math.ceil(n_devices / per))
    per = int(devices_per_actor)
    n_actors = math.ceil(n_devices / per)
    if n_actors > capacity:
        _fail(n_actors, actor, resources)
    return Packing(per, n_actors)


def _fail(n_actors: int, actor: ActorSpec, resources: Mapping[str, float]) -> None:
    demand = actor_demand(actor)
    need = ", ".join(f"{k}={v * n_actors:g}" for k, v in demand.items())
    have = ", ".join(f"{k}={resources.get(k, 0.0):g}" for k in demand)
    raise ResourceError(
        f"execution: {n_actors} DeviceActor(s) need {need} but the cluster has {have}; "
        "raise devices_per_actor (or use auto), lower execution.actor resources, or add nodes")
