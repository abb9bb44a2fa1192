"""The serial in-process executor: the reference semantics and the debugger's backend.

Devices are packed into hosts exactly as the Ray executor packs them into actors, so tests can
check that packing never changes results without starting Ray.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from raymm.config.schema import Scenario
from raymm.device.lockstep_host import make_host
from raymm.population.faults import host_kills
from raymm.protocol.messages import Broadcast, HostResult, OnlineReport, RoundPlan
from raymm.protocol.record import RoundRecord
from raymm.server.server import Server
from raymm.sim.allocator import keep_freed_memory
from raymm.sim.engine import Trained, World
from raymm.training.accelerator import choose_accelerator


def pack_devices(n_devices: int, per_host: int) -> list[np.ndarray]:
    """Contiguous blocks of device ids, `per_host` each (the last may be smaller)."""
    return [np.arange(s, min(s + per_host, n_devices)) for s in range(0, n_devices, per_host)]


class SerialExecutor:
    name = "serial"

    def __init__(self, devices_per_host: int | None = None) -> None:
        self.devices_per_host = devices_per_host

    def prestart(self, sc: Scenario) -> None:
        """Nothing to start ahead: the hosts live in this process."""

    def start(self, world: World) -> None:
        keep_freed_memory()  # a round's large buffers are reused, not page-faulted afresh
        n = world.population.n
        per = self.devices_per_host or n
        self.faults, self.fault_seed = world.host_spec.faults, world.host_spec.fault_seed
        self.server = Server(world.scenario, world.dataset, world.population, world.policies)
        accelerator, _ = choose_accelerator(world.host_spec.accelerator, torch.cuda.is_available())
        self.hosts = [make_host(ids, world.population, world.dataset, world.host_spec, accelerator)
                      for ids in pack_devices(n, per)]

    def ready(self) -> None:
        """The hosts were built by `start`."""

    def poll(self, t: int) -> list[OnlineReport]:
        return [h.report_online(t) for h in self.hosts]

    def plan(self, t: int, reports: list[OnlineReport]) -> tuple[RoundPlan, Broadcast]:
        return self.server.plan(t, reports)

    def train(self, t: int, planned: tuple[RoundPlan, Broadcast]) -> Trained:
        """Train the hosts with selected devices. A host that an injected fault kills this
        round returns nothing; its devices keep their state from before the round."""
        plan, bcast = planned
        kills = host_kills(self.faults, self.fault_seed, t, len(self.hosts))
        out = Trained([], [], 0)
        for host, killed in zip(self.hosts, kills):
            mine = host.selected(plan)
            if mine.size == 0:
                continue
            if killed:
                out.lost.append(mine)
                out.hosts_killed += 1
            else:
                out.results.append(host.train(plan, bcast))
        return out

    def train_now(self, plan: RoundPlan, bcast: Broadcast) -> list[HostResult]:
        """Train `plan`'s devices now and return the hosts' results (the asynchronous loop,
        `raymm.sim.async_loop`: no fault injection of hosts)."""
        return [h.train(plan, bcast) for h in self.hosts if h.selected(plan).size]

    def aggregate(self, t: int, planned: tuple[RoundPlan, Broadcast],
                  trained: Trained) -> RoundRecord:
        record = self.server.aggregate(t, planned[0], trained.results, trained.lost_ids())
        record.row["actors_killed"] = trained.hosts_killed
        return record

    def evaluate(self, t: int) -> RoundRecord:
        return self.server.evaluate(t)

    def evaluate_devices(self, t: int) -> dict[str, Any]:
        payload = self.server.eval_payload(t)
        return self.server.device_metrics([h.evaluate_devices(payload) for h in self.hosts])

    def get(self, value: Any) -> Any:
        return value

    def server_state(self) -> dict[str, Any]:
        return self.server.state_dict()

    def load_server_state(self, state: dict[str, Any]) -> None:
        self.server.load_state_dict(state)

    def host_states(self) -> dict[int, np.ndarray]:
        out: dict[int, np.ndarray] = {}
        for h in self.hosts:
            out.update(h.state_dict())
        return out

    def load_host_states(self, state: dict[int, np.ndarray]) -> None:
        for h in self.hosts:
            h.load_state_dict(state)

    def shutdown(self) -> None:
        return None
