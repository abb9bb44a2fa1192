"""DeviceActor: one Ray actor hosting one or more simulated devices (a `DeviceHost`).

An actor that Ray gave a GPU (or a fraction of one: `execution.actor.num_gpus: 0.1` packs ten
actors per GPU) trains on it; Ray sets CUDA_VISIBLE_DEVICES, so the GPU is `cuda` here.

An actor that Ray restarted after a crash has lost its devices' local state. Until the executor
gives it back (`load_state_dict`), it refuses to report or train, so the crash is seen, never
hidden behind devices that silently start over.
"""

from __future__ import annotations

import logging
import os
from dataclasses import replace
from typing import Any

import numpy as np
import ray
import torch

from actors.process import keep_freed_memory
from raymm.data.base import Dataset
from raymm.host import HostSpec
from raymm.messages import Broadcast, DeviceEval, HostResult, OnlineReport, RoundPlan
from raymm.population import Population
from raymm.torch_device import choose_torch_device
from raymm.hosts import make_host


@ray.remote
class DeviceActor:
    def __init__(self, device_ids: np.ndarray, population: list[ray.ObjectRef],
                 dataset: list[ray.ObjectRef], spec: HostSpec) -> None:
        keep_freed_memory()
        # shared objects arrive wrapped in a list, so Ray passes the reference (zero-copy get
        # here) instead of pinning them as constructor arguments
        pop: Population = ray.get(population[0])
        data: Dataset = ray.get(dataset[0])
        self.gpu_ids = [str(g) for g in ray.get_gpu_ids()]
        self.device, why = choose_torch_device(spec.device, torch.cuda.is_available(),
                                               self.gpu_ids)
        if why:
            logging.getLogger("raymm.actors").warning(why)
        self.host = make_host(device_ids, pop, data, spec, self.device)
        self.restored = not ray.get_runtime_context().was_current_actor_reconstructed

    def _check_restored(self) -> None:
        if not self.restored:
            raise RuntimeError("this DeviceActor was restarted after a crash and has not got "
                               "its devices' state back yet")

    def report_online(self, t: int) -> OnlineReport:
        self._check_restored()
        return self.host.report_online(t)

    @ray.method(num_returns=3)
    def train(self, plan: RoundPlan, broadcast: Broadcast, die: bool = False,
              next_round: int | None = None
              ) -> tuple[dict[str, Any], HostResult, OnlineReport | None]:
        """Three objects: a small status for the driver (this actor's selected devices and their
        local states to keep safe), the result for the server, and the report of `next_round`
        (availability does not depend on training, so it is answered here instead of in a
        task of its own). `die` is an injected fault: the process exits in the middle of the
        round."""
        self._check_restored()
        mine = self.host.selected(plan)
        if die:
            self.host.train(replace(plan, selected=mine[: mine.shape[0] // 2]), broadcast)
            os._exit(1)
        result = self.host.train(plan, broadcast)
        report = None if next_round is None else self.host.report_online(next_round)
        return {"selected": mine, "states": result.states}, replace(result, states={}), report

    def evaluate_devices(self, payload: Broadcast) -> DeviceEval:
        self._check_restored()
        return self.host.evaluate_devices(payload)

    def state_dict(self) -> dict[int, Any]:
        return self.host.state_dict()

    def load_state_dict(self, state: dict[int, Any]) -> None:
        self.host.load_state_dict(state)
        self.restored = True

    def placement(self) -> dict[str, Any]:
        """Where Ray put this actor: node id and address, the GPU ids it was given, the torch
        device it trains on, and how many simulated devices it hosts."""
        ctx = ray.get_runtime_context()
        return {"node_id": ctx.get_node_id(), "node_ip": ray.util.get_node_ip_address(),
                "gpu_ids": self.gpu_ids, "torch_device": self.device,
                "devices": int(self.host.ids.shape[0]),
                "first_device": int(self.host.ids[0]) if self.host.ids.shape[0] else -1}
