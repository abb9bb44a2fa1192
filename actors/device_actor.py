"""DeviceActor: one Ray actor hosting one or more simulated devices (a `DeviceHost`)."""

from __future__ import annotations

from typing import Any

import numpy as np
import ray

from raymm.data.base import Dataset
from raymm.host import DeviceHost, HostSpec
from raymm.messages import Broadcast, DeviceEval, HostResult, OnlineReport, RoundPlan
from raymm.population import Population


@ray.remote
class DeviceActor:
    def __init__(self, device_ids: np.ndarray, population: list[ray.ObjectRef],
                 dataset: list[ray.ObjectRef], spec: HostSpec) -> None:
        # shared objects arrive wrapped in a list, so Ray passes the reference (zero-copy get
        # here) instead of pinning them as constructor arguments
        pop: Population = ray.get(population[0])
        data: Dataset = ray.get(dataset[0])
        self.host = DeviceHost(device_ids, pop, data, spec)

    def report_online(self, t: int) -> OnlineReport:
        return self.host.report_online(t)

    def train(self, plan: RoundPlan, broadcast: Broadcast) -> HostResult:
        return self.host.train(plan, broadcast)

    def evaluate_devices(self, payload: Broadcast) -> DeviceEval:
        return self.host.evaluate_devices(payload)

    def state_dict(self) -> dict[int, Any]:
        return self.host.state_dict()

    def load_state_dict(self, state: dict[int, Any]) -> None:
        self.host.load_state_dict(state)

    def placement(self) -> dict[str, Any]:
        """Where Ray put this actor: node id and the GPU ids it was given."""
        ctx = ray.get_runtime_context()
        return {"node_id": ctx.get_node_id(), "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
                "devices": int(self.host.ids.shape[0])}
