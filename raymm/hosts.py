"""Which host an executor builds: the sequential `DeviceHost`, or `VectorisedHost`, whose
selected devices train in lock-step (`raymm.vectorised`) and whose bookkeeping -- failures,
device state, uploads, stacking -- stays `DeviceHost`'s own.
"""

from __future__ import annotations

import logging

import numpy as np

from raymm import exchange
from raymm.data.base import Dataset
from raymm.device_state import DeviceState
from raymm.faults import device_crashes
from raymm.host import DeviceHost, HostSpec
from raymm.messages import Broadcast, HostResult, RoundPlan
from raymm.population import Population
from raymm.vectorised import Request, VectorisedTrainer, _PrecomputedTrainer, why_not_vectorised

log = logging.getLogger("raymm.vectorised")


def make_host(device_ids: np.ndarray, population: Population, dataset: Dataset,
              spec: HostSpec, device: str = "cpu") -> DeviceHost:
    """The host an executor should build: lock-step when the scenario asks for it."""
    cls = VectorisedHost if spec.training.vectorise else DeviceHost
    return cls(device_ids, population, dataset, spec, device)


class VectorisedHost(DeviceHost):
    """A `DeviceHost` whose selected devices train in lock-step (see the module docstring)."""

    def __init__(self, device_ids: np.ndarray, population: Population, dataset: Dataset,
                 spec: HostSpec, device: str = "cpu") -> None:
        super().__init__(device_ids, population, dataset, spec, device)
        base = self.trainer
        self.reason = why_not_vectorised(spec.objective, base.model)
        self.vec = None
        if self.reason is not None:
            log.warning("training sequentially: %s", self.reason)
            return
        self.vec = VectorisedTrainer(base, spec.training.vectorise_chunk)
        self.trainer = _PrecomputedTrainer(base)  # type: ignore[assignment]

    def train(self, plan: RoundPlan, broadcast: Broadcast) -> HostResult:
        """Lock-step training of the selected devices, then `DeviceHost.train` hands out the
        outcomes: it recomputes each device's start vectors (`exchange.start_vectors` is pure)
        and runs `exchange.finish`, so device state, uploads and snapshots are its own."""
        if self.vec is None:
            return super().train(plan, broadcast)
        mine = self.selected(plan)
        crash = device_crashes(self.spec.faults, self.spec.fault_seed, plan.round, mine)
        training = self.spec.training
        pre: _PrecomputedTrainer = self.trainer  # type: ignore[assignment]
        requests = []
        starts: dict[int, tuple[dict[str, np.ndarray], DeviceState]] = {}
        pop = self.pop
        offsets, rows, masks = pop.data_offsets, pop.data_indices, pop.sensor_mask
        for dev, crashed in zip(mine.tolist(), crash):
            if crashed:
                continue
            held = masks[dev]
            groups = self.groups_of(held, plan)
            try:
                start, state = exchange.start_vectors(training.exchange, plan, broadcast, dev,
                                                      groups, self.state_of(dev),
                                                      pre.base.initial)
            except Exception:  # noqa: BLE001 - the sequential path records the failure
                continue
            starts[dev] = (start, state)  # `DeviceHost._train` reuses them
            requests.append(Request(dev, rows[offsets[dev]:offsets[dev + 1]], held,
                                    tuple(groups), state.adapter, start, dict(state.objective)))
        try:
            done = self.vec.train(requests, plan.round, broadcast, plan.upload)
            pre.ready = {r.device: ((plan.round, r.groups), done[r.device])
                         for r in requests if r.device in done}
            return self._train(plan, broadcast, starts)
        finally:
            pre.ready = {}
