"""The Ray executor: DeviceActors host devices, a ServerActor owns global state.

Per round: every DeviceActor reports its online devices; the ServerActor plans and returns the
plan and the broadcast as two objects (the broadcast is stored once and handed to every actor
by reference); each DeviceActor with selected devices returns one result object, which goes
straight to the ServerActor, and a small status for the driver. No per-device Ray call.

The driver submits the whole round at once -- reports into the plan, the plan into training,
results into aggregation -- as a chain of object references, and waits once, at the end. Ray
runs each task as soon as its inputs exist, so no step waits for a round trip to the driver.
Availability does not depend on training, so each training call also returns the actor's report
for the next round (an idle actor is asked separately): the next plan finds them waiting. The
driver even submits that plan with the round's aggregation (`execution.plan_ahead`), so the
server plans round t+1 while round t's statistics travel to the driver, and round t+1 starts
with its plan at hand; not after an evaluation or a checkpoint round (`engine.plans_ahead`).
A plan made ahead is part of the server's state until its round is aggregated, so a run
interrupted in between resumes with that very plan.

A DeviceActor that dies costs the round its devices' updates, not the run: Ray restarts it
(`max_restarts`; past that a new actor is created), and the executor gives the restarted actor
its devices' local state back from the copy it keeps of every device's storage. A task whose
input is an error is never run, so when the chain breaks nothing downstream of the break has
happened, and the executor redoes just that part the careful way, one actor at a time.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import ray
from ray.exceptions import ActorUnavailableError, OutOfMemoryError, RayActorError, RayError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from actors import autoscale
from actors.device_actor import DeviceActor, NoHostYet
from actors.driver_server import DriverServer
from actors.packing import ActorMemory, Packing, actor_demand, plan_packing
from actors.quiet import (
    driver_stderr_captured,
    loopback_only,
    quiet_ray,
    ray_logging_level,
    verbose,
)
from actors.runtime_env import plugin_runtime_env
from actors.server_actor import ServerActor
from raymm.config.schema import ExecutionSpec, Scenario
from raymm.data.mapped import for_workers
from raymm.device.footprint import footprint
from raymm.errors import RaymmError
from raymm.population.faults import host_kills
from raymm.protocol.record import RoundRecord
from raymm.sim.engine import Trained, World, plans_ahead
from raymm.training.lockstep.fallback import LockstepFallback

log = logging.getLogger(__name__)
REVIVE_TIMEOUT_S = 300


class ActorOutOfMemory(RaymmError):
    """A DeviceActor was killed for lack of memory: the run stops with what it held."""


def killed_for_memory(exc: BaseException) -> bool:
    """Whether Ray says a worker died because its node ran low on memory (the raylet's memory
    monitor, or the kernel's OOM killer as Ray reports it)."""
    if isinstance(exc, OutOfMemoryError):
        return True
    text = str(exc).lower()
    return bool(re.search(r"\boom\b|out ?of ?memory|low on memory|memory pressure", text))


def ensure_ray(execution: ExecutionSpec) -> bool:
    """Connect to a cluster or start an embedded local Ray. Returns True if we started it."""
    if ray.is_initialized():
        return False
    quiet_ray()
    level = ray_logging_level()
    address = execution.address
    if address == "auto" or (address is None and os.environ.get("RAY_ADDRESS")):
        ray.init(address="auto", logging_level=level, log_to_driver=verbose())
    elif address is not None:
        ray.init(address=address, logging_level=level, log_to_driver=verbose())
    else:
        # "local": always a fresh embedded Ray, never a cluster that happens to run on this
        # machine (another user's, or a test's); connect to one with RAY_ADDRESS or
        # execution.address
        with loopback_only():
            ray.init(address="local", num_cpus=execution.local_num_cpus,
                     include_dashboard=False, logging_level=level, log_to_driver=verbose(),
                     _node_ip_address="127.0.0.1")
    return True


class RayExecutor:
    name = "ray"

    def __init__(self, execution: ExecutionSpec, plugins: Sequence[str] = (),
                 plugin_paths: Sequence[str] = ()) -> None:
        """`plugins`: modules every actor imports first; `plugin_paths`: the local folders or
        files of their packages, which travel to the workers (`actors.runtime_env`)."""
        self.execution = execution
        self.plugins, self.plugin_paths = tuple(plugins), tuple(plugin_paths)
        self.runtime_env: dict[str, Any] | None = None
        self._owns_ray = False
        self.vault: dict[int, Any] = {}  # device id -> its local state (its "flash storage")
        self._reports: dict[int, list[Any]] = {}  # round -> its reports, asked for early
        self._polled: list[Any] = []  # the report references this round's plan was given
        # round -> (its plan and broadcast, the reports they were made from), submitted with
        # the previous round's aggregation
        self._ahead: dict[int, tuple[tuple[Any, Any], list[Any]]] = {}

    def prestart(self, sc: Scenario) -> None:
        """Start Ray and create the actors before the driver loads the data: their process
        start and imports (torch, raymm) overlap the driver's work. `start` hands them
        the shared objects. Only the number of devices is needed, from the scenario."""
        if hasattr(self, "actors"):
            return
        self._owns_ray = ensure_ray(self.execution)
        self.runtime_env = plugin_runtime_env(self.plugins, self.plugin_paths)
        ex, n = self.execution, sc.population.devices
        self.memory = ActorMemory(ex.actor, footprint(sc))
        self.packing: Packing = autoscale.fit_or_grow(
            lambda res: plan_packing(n, ex.devices_per_actor, ex.actor, res, self.memory),
            lambda: self._wanted(n), autoscale.current_resources, ex.autoscale_timeout_s,
            enabled=ex.autoscale == "auto")
        # the server beside this driver (a node lost elsewhere costs devices, not the run), or
        # in it (`execution.server: driver`)
        self.server = DriverServer() if ex.server == "driver" else self._server_actor()
        self.blocks = self.packing.ranges(n)
        self.actors = [self._new_actor(ids) for ids in self.blocks]

    def start(self, world: World) -> None:
        """Give every actor the shared objects; each builds its host and warms it up
        (`ready` waits for that)."""
        self.prestart(world.scenario)
        n = world.population.n
        if sum(b.shape[0] for b in self.blocks) != n:
            raise RaymmError(f"the actors were created for {sum(map(len, self.blocks))} "
                             f"devices, the population has {n}")
        self.scenario = world.scenario
        self.faults, self.fault_seed = world.host_spec.faults, world.host_spec.fault_seed
        # a memory-mapped dataset travels as the loader call that opens it (`for_workers`):
        # each actor maps the files itself instead of Ray copying them into its object store
        data = for_workers(world.dataset, world.scenario.dataset_name,
                           world.scenario.dataset_params(), world.scenario.seed)
        pop_ref, data_ref = ray.put(world.population), ray.put(data)
        # kept alive for the whole run: a restarted actor is given them again (`_revive`)
        self._shared = ([pop_ref], [data_ref], world.host_spec)
        self._setups = [self.server.setup.remote(world.scenario, [data_ref], [pop_ref],
                                                 world.policies),
                        *[a.setup.remote(*self._shared) for a in self.actors]]

    def ready(self) -> None:
        """Wait until the server and every DeviceActor are set up and warmed up, so that round
        1 is timed as a steady round. Optional: an actor's calls run after its setup anyway.
        A setup that raised is raised here; a DeviceActor that died meanwhile is left to round
        1, which revives it as it does any crashed actor."""
        server, *device_setups = self._setups
        ray.get(server)
        for i, ref in enumerate(device_setups):
            try:
                ray.get(ref)
            except RayActorError as exc:
                log.info("DeviceActor %d died while setting up: %s", i, type(exc).__name__)

    def _server_actor(self) -> Any:
        # mypy does not apply class decorators (python/mypy#3135): ray.remote made these
        # classes ray.actor.ActorClass, which has `options`
        return ServerActor.options(  # type: ignore[attr-defined]
            num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(
                ray.get_runtime_context().get_node_id(), soft=False), **self._env()).remote()

    def _wanted(self, n: int) -> list[dict[str, float]]:
        """The actors' bundles to ask an autoscaler for: a fixed devices_per_actor's every
        actor; `auto`'s one (it then takes as many as fit)."""
        dpa = self.execution.devices_per_actor
        per = n if dpa == "auto" else int(dpa)
        count = 1 if dpa == "auto" else -(-n // per)
        return [actor_demand(self.execution.actor, self.memory(per))] * count

    def _new_actor(self, ids: np.ndarray) -> Any:
        a = self.execution.actor
        memory = self.memory(int(ids.shape[0]))
        with driver_stderr_captured():
            return DeviceActor.options(  # type: ignore[attr-defined]  # see _server_actor()
                num_cpus=a.num_cpus, num_gpus=a.num_gpus, resources=dict(a.resources),
                max_restarts=a.max_restarts, **({"memory": memory} if memory else {}),
                **self._env()).remote(ids)

    def _died(self, i: int, t: int, exc: BaseException) -> None:
        """Actor i died in round t: one line and the run stops when Ray says it was for
        memory (restarting it would only repeat that); otherwise it is revived. A lock-step
        fallback raised under strict mode (`raymm.training.lockstep.fallback.strict`) is no
        death: it stops the run."""
        cause = getattr(exc, "cause", None)
        if isinstance(cause, LockstepFallback):
            raise cause
        if killed_for_memory(exc):
            ids = self.blocks[i]
            raise ActorOutOfMemory(
                f"DeviceActor {i} (devices {ids.min()}-{ids.max()}) was killed for lack of "
                f"memory in round {t} on its node; it held about "
                f"{self.memory.describe(int(ids.shape[0]))} (Ray's own words: "
                f"{_first_line(exc)}); give the actors more memory "
                "(execution.actor.memory, bigger nodes) or fewer devices each, and resume "
                "from the last checkpoint") from None
        log.info("DeviceActor %d died in round %d: %s", i, t, type(exc).__name__)
        self._revive(i)

    def _env(self) -> dict[str, Any]:
        """The actors' runtime environment, when the run has plugins to ship."""
        return {} if self.runtime_env is None else {"runtime_env": self.runtime_env}

    def poll(self, t: int) -> list[Any] | None:
        """The actors' reports, as references: they go straight into the server's plan. None
        when the round was planned ahead: its reports went into that plan."""
        if t in self._ahead:
            return None
        early = self._reports.pop(t, None)
        self._polled = early if early is not None else \
            [a.report_online.remote(t) for a in self.actors]
        return self._polled

    def _poll_next(self, t: int, calls: list[tuple[int, Any, Any, Any]]) -> None:
        """Round t+1's reports: those the training calls return, and a call to each idle actor."""
        if t >= self.scenario.rounds:
            self._reports = {}
            return
        early = {i: report for i, _, _, report in calls}
        self._reports = {t + 1: [early[i] if i in early else a.report_online.remote(t + 1)
                                 for i, a in enumerate(self.actors)]}

    def _poll_carefully(self, t: int) -> list[Any]:
        """The reports of the actors that answered this round's poll; a dead (or restarted)
        actor's devices are simply not online this round, and the actor is revived for the next
        one."""
        reports = []
        for i, ref in enumerate(self._polled):
            try:
                reports.append(ray.get(ref))
            except RayError as exc:
                log.info("DeviceActor %d did not report in round %d", i, t)
                self._died(i, t, exc)
        return reports

    def plan(self, t: int, reports: list[Any] | None) -> tuple[Any, Any]:
        ahead = self._ahead.pop(t, None)
        if ahead is not None:
            planned, self._polled = ahead
            return planned
        plan_ref, bcast_ref = self.server.plan.remote(t, *(reports or []))
        return plan_ref, bcast_ref

    def _plan_ahead(self, t: int) -> None:
        """Submit round t+1's plan behind round t's aggregation (the server runs them in that
        order); its reports are those `_poll_next` asked for."""
        if plans_ahead(t, self.scenario):
            reports = self._reports.pop(t + 1)
            self._ahead = {t + 1: (self.plan(t + 1, reports), reports)}

    def train(self, t: int, planned: tuple[Any, Any]) -> list[tuple[int, Any, Any, Any]] | None:
        """One call per DeviceActor that has selected devices. When almost every actor has some
        (at least 4 selected devices per actor: an actor is idle with probability below
        e^-4), every actor is called with the plan's reference and the driver never waits for
        the plan; an idle actor returns an empty result. None: the plan failed (an actor died
        before reporting), and `aggregate` replays the round."""
        plan_ref, bcast_ref = planned
        kills = host_kills(self.faults, self.fault_seed, t, len(self.actors))
        if 4 * len(self.actors) <= self.scenario.selection.k:
            busy = list(range(len(self.actors)))
        else:
            try:
                plan = ray.get(plan_ref)  # small: ids of the selected devices
            except RayError:
                return None
            busy = [i for i, ids in enumerate(self.blocks) if np.isin(plan.selected, ids).any()]
        nxt = t + 1 if t < self.scenario.rounds else None
        calls = []
        for i in busy:
            status, result, report = self.actors[i].train.remote(plan_ref, bcast_ref,
                                                                 bool(kills[i]), nxt)
            calls.append((i, status, result, report))
        return calls

    def aggregate(self, t: int, planned: tuple[Any, Any],
                  calls: list[tuple[int, Any, Any, Any]] | None) -> RoundRecord:
        """Aggregation of every result, submitted before any of them exists; the driver waits
        once, for the statistics, the plan and the statuses together. If that fails, an actor
        died: before reporting (the plan failed: replay the whole round carefully) or while
        training (its devices are lost this round; aggregate the others)."""
        plan_ref = planned[0]
        if calls is not None:
            # nothing lost: None, not an empty array, which Ray would serialise on every call
            # (docs/performance.md, "Smaller mechanisms")
            stats_ref = self.server.aggregate.remote(t, plan_ref,
                                                     *[r for _, _, r, _ in calls], lost=None)
            self._poll_next(t, calls)
            self._plan_ahead(t)
            try:
                stats, plan, *statuses = ray.get([stats_ref, plan_ref,
                                                  *[s for _, s, _, _ in calls]])
            except RayError:
                pass
            else:
                for status in statuses:
                    self.vault.update(status["states"])
                stats.row["actors_killed"] = 0
                return stats
            try:
                ray.get(plan_ref)
            except RayError:
                calls = None
        if calls is None:
            planned = self.plan(t, self._poll_carefully(t))
            plan_ref = planned[0]
            # still None only if the server itself failed to plan: the next get raises it
            calls = self.train(t, planned) or []
        return self._aggregate_carefully(t, plan_ref, calls)

    def _aggregate_carefully(self, t: int, plan_ref: Any,
                             calls: list[tuple[int, Any, Any, Any]]) -> RoundRecord:
        """Collect the statuses one by one (a dead actor is an error value: its selected devices
        are lost this round and it is revived), then aggregate the surviving results."""
        # asked of actors that may be dead now: ask again next round (a plan made ahead from a
        # dead actor's report never ran; one that did is the server's to hand out again)
        self._reports, self._ahead = {}, {}
        out = Trained([], [], 0)
        plan = ray.get(plan_ref)
        for i, status_ref, result_ref, _ in calls:
            try:
                status = ray.get(status_ref)
            except RayError as exc:
                out.lost.append(plan.selected[np.isin(plan.selected, self.blocks[i])])
                out.hosts_killed += 1
                self._died(i, t, exc)
                continue
            self.vault.update(status["states"])
            if status["selected"].size:
                out.results.append(result_ref)
        stats = ray.get(self.server.aggregate.remote(t, plan_ref, *out.results,
                                                     lost=out.lost_ids()))
        stats.row["actors_killed"] = out.hosts_killed
        return stats

    def train_now(self, plan: Any, bcast: Any) -> list[Any]:
        """Train `plan`'s devices now, one call per DeviceActor holding some, and return the
        results (the asynchronous loop, `raymm.sim.async_loop`); their states go to the vault.
        A DeviceActor that dies here stops the run (no revival mid-flight yet)."""
        plan_ref, bcast_ref = ray.put(plan), ray.put(bcast)
        busy = [i for i, ids in enumerate(self.blocks) if np.isin(plan.selected, ids).any()]
        calls = [self.actors[i].train.remote(plan_ref, bcast_ref, False, None) for i in busy]
        got = ray.get([c[0] for c in calls] + [c[1] for c in calls])
        for status in got[:len(calls)]:
            self.vault.update(status["states"])
        return got[len(calls):]

    def _revive(self, i: int) -> None:
        """Give a (restarted or, past max_restarts, replaced) actor its host and its devices'
        state back (a restart re-runs the constructor only)."""
        state = {d: self.vault[d] for d in self.blocks[i].tolist() if d in self.vault}
        try:
            self._restore(i, state)
        except RayError:
            # a fresh actor, once the old one is gone for good: while Ray keeps restarting it,
            # it holds the CPUs the new one needs (on a small cluster, all of them)
            ray.kill(self.actors[i], no_restart=True)
            self.actors[i] = self._new_actor(self.blocks[i])
            self._restore(i, state)

    def _restore(self, i: int, state: dict[int, Any]) -> None:
        """Set the actor up and load the state. While Ray is still restarting it, calls fail
        as unavailable, and a `setup` sent then may be lost while the `load_state_dict` behind
        it reaches the restarted actor, which has no host yet: both calls are idempotent, so
        ask again, until REVIVE_TIMEOUT_S."""
        deadline = time.monotonic() + REVIVE_TIMEOUT_S
        while True:
            a = self.actors[i]
            try:
                ray.get([a.setup.remote(*self._shared), a.load_state_dict.remote(state)],
                        timeout=max(deadline - time.monotonic(), 1.0))
                return
            except (ActorUnavailableError, NoHostYet):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def evaluate(self, t: int) -> Any:
        return self.server.evaluate.remote(t)

    def evaluate_devices(self, t: int) -> Any:
        payload = self.server.eval_payload.remote(t)  # stored once, read by every actor
        parts = [a.evaluate_devices.remote(payload) for a in self.actors]
        for i, part in enumerate(parts):
            try:
                ray.get(part)
            except RayError as exc:  # crashed since training: give it its state back, retry
                log.info("DeviceActor %d failed to evaluate in round %d", i, t)
                self._died(i, t, exc)
                parts[i] = self.actors[i].evaluate_devices.remote(payload)
        return self.server.device_metrics.remote(*parts)

    def get(self, value: Any) -> Any:
        return ray.get(value) if isinstance(value, ray.ObjectRef) else value

    def server_state(self) -> dict[str, Any]:
        return ray.get(self.server.state_dict.remote())

    def load_server_state(self, state: dict[str, Any]) -> None:
        ray.get(self.server.load_state_dict.remote(state))

    def host_states(self) -> dict[int, Any]:
        return dict(self.vault)

    def load_host_states(self, state: dict[int, Any]) -> None:
        self.vault = dict(state)
        ray.get([a.load_state_dict.remote(state) for a in self.actors])

    def placements(self) -> list[dict[str, Any]]:
        return ray.get([a.placement.remote() for a in self.actors])

    def shutdown(self) -> None:
        for a in getattr(self, "actors", []):
            ray.kill(a, no_restart=True)
        if hasattr(self, "server") and not isinstance(self.server, DriverServer):
            ray.kill(self.server)
        if self._owns_ray:
            ray.shutdown()


def _first_line(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return lines[0][:300] if lines else type(exc).__name__
