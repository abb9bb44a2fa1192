"""ServerActor: owns the global state; a thin shell around `raymm.server.server.Server`.
`ServerShell` is the shell itself, which `actors.driver_server` runs in the driver's process
instead (`execution.server: driver`).

Created before the driver has loaded the data, like the DeviceActors: its process start and
imports overlap the driver's work, and
`setup` builds the server from the shared objects."""

from __future__ import annotations

from typing import Any

import numpy as np
import ray

from actors.process import keep_freed_memory
from actors.runtime_env import import_plugins
from raymm.config.schema import Scenario
from raymm.data.base import Dataset
from raymm.data.mapped import received
from raymm.population.devices import Population
from raymm.protocol.messages import Broadcast, DeviceEval, HostResult, OnlineReport, RoundPlan
from raymm.protocol.record import RoundRecord
from raymm.server.server import Policies, Server


class ServerShell:
    def __init__(self) -> None:
        import_plugins()  # before any call's arguments that may refer to them are unpickled
        keep_freed_memory()

    def setup(self, scenario: Scenario, dataset: list[ray.ObjectRef],
              population: list[ray.ObjectRef], policies: Policies) -> None:
        data: Dataset = received(ray.get(dataset[0]))   # a mapped one is opened here
        pop: Population = ray.get(population[0])
        self.server = Server(scenario, data, pop, policies)

    @ray.method(num_returns=2)
    def plan(self, t: int, *reports: OnlineReport) -> tuple[RoundPlan, Broadcast]:
        return self.server.plan(t, list(reports))

    def aggregate(self, t: int, plan: RoundPlan, *results: HostResult,
                  lost: np.ndarray | None = None) -> RoundRecord:
        return self.server.aggregate(t, plan, list(results), lost)

    def evaluate(self, t: int) -> RoundRecord:
        return self.server.evaluate(t)

    def eval_payload(self, t: int) -> Broadcast:
        return self.server.eval_payload(t)

    def device_metrics(self, *parts: DeviceEval) -> dict[str, Any]:
        return self.server.device_metrics(list(parts))

    def state_dict(self) -> dict[str, Any]:
        return self.server.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.server.load_state_dict(state)


ServerActor = ray.remote(ServerShell)
