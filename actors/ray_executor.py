"""The Ray executor: DeviceActors host devices, a ServerActor owns global state.

Per round: every DeviceActor reports its online devices; the ServerActor plans and returns the
plan and the broadcast as two objects (the broadcast is stored once and handed to every actor
by reference); each DeviceActor with selected devices returns one object; the ServerActor
aggregates them (sorted by device id). No per-device Ray call anywhere.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import numpy as np
import ray

from actors.device_actor import DeviceActor
from actors.packing import Packing, plan_packing
from actors.server_actor import ServerActor
from raymm.config import ExecutionSpec
from raymm.engine import World
from raymm.local import build_model
from raymm.vectorised import why_not_vectorised


def ensure_ray(execution: ExecutionSpec) -> bool:
    """Connect to a cluster or start an embedded local Ray. Returns True if we started it."""
    if ray.is_initialized():
        return False
    address = execution.address
    if address == "auto" or (address is None and os.environ.get("RAY_ADDRESS")):
        ray.init(address="auto", logging_level="WARNING", log_to_driver=False)
    elif address is not None:
        ray.init(address=address, logging_level="WARNING", log_to_driver=False)
    else:
        # "local": always a fresh embedded Ray, never a cluster that happens to run on this
        # machine (another user's, or a test's); connect to one with RAY_ADDRESS or
        # execution.address
        ray.init(address="local", num_cpus=execution.local_num_cpus, include_dashboard=False,
                 logging_level="WARNING", log_to_driver=False)
    return True


def warn_if_not_vectorised(world: World) -> None:
    """Say on the driver, not only in the actors' logs, when lock-step training was asked for
    but the objective or model cannot do it."""
    sc = world.scenario
    if sc.training.vectorise:
        why = why_not_vectorised(world.host_spec.objective,
                                 build_model(world.dataset, sc.model, sc.seed))
        if why:
            logging.getLogger("raymm.vectorised").warning("training sequentially: %s", why)


class RayExecutor:
    name = "ray"

    def __init__(self, execution: ExecutionSpec) -> None:
        self.execution = execution
        self._owns_ray = False

    def start(self, world: World) -> None:
        warn_if_not_vectorised(world)
        self._owns_ray = ensure_ray(self.execution)
        ex = self.execution
        self.k = world.scenario.selection.k
        self.packing: Packing = plan_packing(world.population.n, ex.devices_per_actor, ex.actor,
                                             ray.cluster_resources())
        pop_ref, data_ref = ray.put(world.population), ray.put(world.dataset)
        # kept alive for the whole run: a restarted actor re-reads its constructor arguments
        self._shared = (pop_ref, data_ref)
        self.server = ServerActor.options(num_cpus=0).remote(
            world.scenario, [data_ref], [pop_ref], world.policies)
        opts = dict(num_cpus=ex.actor.num_cpus, num_gpus=ex.actor.num_gpus,
                    resources=dict(ex.actor.resources), max_restarts=ex.actor.max_restarts)
        per, n = self.packing.devices_per_actor, world.population.n
        self.blocks = [np.arange(s, min(s + per, n)) for s in range(0, n, per)]
        self.actors = [DeviceActor.options(**opts).remote(ids, [pop_ref], [data_ref],
                                                          world.host_spec)
                       for ids in self.blocks]

    def poll(self, t: int) -> list[Any]:
        return [a.report_online.remote(t) for a in self.actors]

    def plan(self, t: int, reports: list[Any]) -> tuple[Any, Any]:
        plan_ref, bcast_ref = self.server.plan.remote(t, *reports)
        return plan_ref, bcast_ref

    def train(self, t: int, planned: tuple[Any, Any]) -> list[Any]:
        """One call per DeviceActor that has selected devices. When almost every actor has some
        (at least 4 selected devices per actor: an actor is idle with probability below
        e^-4), every actor is called with the plan's reference and the driver never waits for
        the plan; an idle actor returns an empty result."""
        plan_ref, bcast_ref = planned
        if 4 * len(self.actors) <= self.k:
            busy = self.actors
        else:
            plan = ray.get(plan_ref)  # small: ids of the selected devices
            busy = [a for a, ids in zip(self.actors, self.blocks)
                    if np.isin(plan.selected, ids).any()]
        return [a.train.remote(plan_ref, bcast_ref) for a in busy]

    def aggregate(self, t: int, planned: tuple[Any, Any], results: list[Any]) -> Any:
        return self.server.aggregate.remote(t, planned[0], *results)

    def evaluate(self, t: int) -> Any:
        return self.server.evaluate.remote(t)

    def get(self, value: Any) -> Any:
        return ray.get(value)

    def server_state(self) -> dict[str, Any]:
        return ray.get(self.server.state_dict.remote())

    def load_server_state(self, state: dict[str, Any]) -> None:
        ray.get(self.server.load_state_dict.remote(state))

    def host_states(self) -> dict[int, np.ndarray]:
        out: dict[int, np.ndarray] = {}
        for s in ray.get([a.state_dict.remote() for a in self.actors]):
            out.update(s)
        return out

    def load_host_states(self, state: dict[int, np.ndarray]) -> None:
        ray.get([a.load_state_dict.remote(state) for a in self.actors])

    def placements(self) -> list[dict[str, Any]]:
        return ray.get([a.placement.remote() for a in self.actors])

    def shutdown(self) -> None:
        for a in getattr(self, "actors", []):
            ray.kill(a)
        if hasattr(self, "server"):
            ray.kill(self.server)
        if self._owns_ray:
            ray.shutdown()
