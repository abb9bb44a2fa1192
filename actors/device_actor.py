"""DeviceActor: one Ray actor hosting one or more simulated devices (a `DeviceHost`).

An actor that Ray gave a GPU (or a fraction of one: `execution.actor.num_gpus: 0.1` packs ten
actors per GPU) trains on it; Ray sets CUDA_VISIBLE_DEVICES, so the GPU is `cuda` here. Torch
is put in deterministic CUDA mode in `setup`, before the host touches the GPU
(`raymm.training.accelerator.deterministic_cuda`).

An actor is created before the driver has loaded the data (its process start and imports --
torch, raymm -- overlap the driver's work) and gets the shared objects in `setup`, which builds
its host and warms it up (`raymm.device.warmup`) while the server plans round 1. An actor that Ray
restarted after a crash has re-run only its constructor: it has no host and has lost its
devices' local state. Until the executor gives both back (`setup`, then `load_state_dict`), it
refuses to report or train, so the crash is seen, never hidden behind devices that silently
start over.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import replace
from typing import Any

import numpy as np
import ray
import torch

import actors
from actors.process import keep_freed_memory
from actors.runtime_env import import_plugins
from raymm.data.base import Dataset
from raymm.data.mapped import received
from raymm.device.host import DeviceHost, HostSpec
from raymm.device.lockstep_host import make_host
from raymm.device.warmup import warm_up, warm_up_transforms
from raymm.population.devices import Population
from raymm.protocol.messages import Broadcast, DeviceEval, HostResult, OnlineReport, RoundPlan
from raymm.training.accelerator import choose_accelerator


class NoHostYet(RuntimeError):
    """The actor was (re)started and not set up yet; the driver then sets it up and retries."""


@ray.remote
class DeviceActor:
    def __init__(self, device_ids: np.ndarray) -> None:
        start = time.time()
        import_plugins()  # before any call's arguments that may refer to them are unpickled
        keep_freed_memory()
        self.device_ids = device_ids
        self._host: DeviceHost | None = None
        self.gpu_ids = [str(g) for g in ray.get_gpu_ids()]
        self.accelerator = "cpu"
        self.restored = not ray.get_runtime_context().was_current_actor_reconstructed
        warm_up_transforms()  # needs no data: done while the driver still loads it
        # wall-clock marks (time.time(), comparable with the driver's on one machine)
        self.marks = {"import_start": actors.IMPORTED_AT, "init_start": start,
                      "init_end": time.time()}

    def setup(self, population: list[ray.ObjectRef], dataset: list[ray.ObjectRef],
              spec: HostSpec) -> None:
        """Build the host from the shared objects and warm it up; a no-op once built.

        The shared objects arrive wrapped in a list, so Ray passes the reference (zero-copy
        get here) instead of resolving them as arguments."""
        if self._host is not None:
            return
        start = time.time()
        pop: Population = ray.get(population[0])
        data: Dataset = received(ray.get(dataset[0]))   # a mapped one is opened here
        got = time.time()
        # nothing here has touched CUDA yet: on a GPU, choosing it also switches torch to
        # deterministic CUDA (cuBLAS workspace, deterministic kernels, no cuDNN benchmarking)
        # before the host puts its model there
        self.accelerator, why = choose_accelerator(spec.accelerator, torch.cuda.is_available(),
                                               self.gpu_ids)
        if why:
            logging.getLogger("raymm.actors").warning(why)
        host = make_host(self.device_ids, pop, data, spec, self.accelerator)
        built = time.time()
        warm_up(host)
        self._host = host
        self.marks.update(setup_start=start, shared_got=got, host_built=built,
                          warmed_up=time.time())

    @property
    def host(self) -> DeviceHost:
        if self._host is None:
            raise NoHostYet("this DeviceActor has no host yet: the executor calls `setup` "
                            "first (again after Ray restarted it)")
        return self._host

    def startup(self) -> dict[str, float]:
        """Seconds of each start-up step: imports (Ray loads this class with its modules:
        torch, raymm), constructor, waiting for setup, getting the shared objects, building
        the host, warming it up; and the wall-clock times the imports began and the host was
        ready."""
        m = self.marks
        out = {"imports": m["init_start"] - m["import_start"],
               "init": m["init_end"] - m["init_start"]}
        if "setup_start" in m:
            out.update(idle_before_setup=m["setup_start"] - m["init_end"],
                       get_shared=m["shared_got"] - m["setup_start"],
                       make_host=m["host_built"] - m["shared_got"],
                       warm_up=m["warmed_up"] - m["host_built"])
        return {**out, "import_start_wall": m["import_start"],
                "ready_wall": m.get("warmed_up", m["init_end"])}

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
        self.host.load_state_dict(state)  # raises before `setup`: no state without a host
        self.restored = True

    def placement(self) -> dict[str, Any]:
        """Where Ray put this actor: node id and address, its process id, the GPU ids it was
        given, the torch device it trains on, and how many simulated devices it hosts."""
        ctx = ray.get_runtime_context()
        ids = np.asarray(self.device_ids)  # answered before `setup` too (a restarted actor)
        return {"node_id": ctx.get_node_id(), "node_ip": ray.util.get_node_ip_address(),
                "pid": os.getpid(), "gpu_ids": self.gpu_ids, "torch_device": self.accelerator,
                "devices": int(ids.shape[0]), "first_device": int(ids.min()) if ids.size else -1}
