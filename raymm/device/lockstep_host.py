"""Which host an executor builds: the sequential `DeviceHost`, or `LockstepHost`, whose
selected devices train in lock-step (`raymm.training.lockstep`) and whose bookkeeping -- failures,
device state, uploads, stacking -- stays `DeviceHost`'s own.
"""

from __future__ import annotations

import logging
from dataclasses import replace

import numpy as np

from raymm.data.base import Dataset
from raymm.device.host import DeviceHost, HostSpec
from raymm.phases import phase
from raymm.population.devices import Population
from raymm.population.faults import device_crashes
from raymm.protocol.device_state import EMPTY, DeviceState
from raymm.protocol.messages import Broadcast, HostResult, RoundPlan
from raymm.protocol.seams import Objective
from raymm.training.lockstep.fallback import why_not_lockstep
from raymm.training.lockstep.program import ChunkRun, Request
from raymm.training.lockstep.trainer import LockstepTrainer

log = logging.getLogger("raymm.training.lockstep")


def make_host(device_ids: np.ndarray, population: Population, dataset: Dataset,
              spec: HostSpec, accelerator: str = "cpu") -> DeviceHost:
    """The host an executor should build: lock-step when the scenario asks for it."""
    cls = LockstepHost if spec.engine.lockstep else DeviceHost
    return cls(device_ids, population, dataset, spec, accelerator)


class LockstepHost(DeviceHost):
    """A `DeviceHost` whose selected devices train in lock-step (see the module docstring)."""

    def __init__(self, device_ids: np.ndarray, population: Population, dataset: Dataset,
                 spec: HostSpec, accelerator: str = "cpu") -> None:
        super().__init__(device_ids, population, dataset, spec, accelerator)
        self.reason = why_not_lockstep(spec.objective, self.trainer.model)
        #: the lock-step trainer beside the sequential one (None: this host trains
        #: sequentially, for `reason`)
        self.lockstep: LockstepTrainer | None = None
        if self.reason is not None:
            # the driver says it once for the run (`raymm.app.build.training_path_notice`)
            log.info("training sequentially: %s", self.reason)
            return
        self.lockstep = LockstepTrainer(self.trainer, spec.engine.chunk, spec.engine.closed_form)

    @phase("host.train.lockstep")
    def train(self, plan: RoundPlan, broadcast: Broadcast) -> HostResult:
        """Lock-step training of the selected devices, then `DeviceHost.train` hands out the
        outcomes: it recomputes each device's start vectors (`exchange.start_vectors` is pure)
        and runs `exchange.finish`, so device state, uploads and snapshots are its own. A
        round with nothing per device to keep or hand out (`_plain`) skips that: the trained
        rows go into the result as they are."""
        lockstep = self.lockstep
        if lockstep is None:
            return super().train(plan, broadcast)
        result = self._train_lockstep(plan, broadcast, lockstep)
        # the devices whose program raised trained sequentially: the round's row counts them
        return replace(result, lockstep_fallbacks=dict(lockstep.fallbacks)) if lockstep.fallbacks \
            else result

    def _train_lockstep(self, plan: RoundPlan, broadcast: Broadcast, lockstep: LockstepTrainer
                        ) -> HostResult:
        """`train`'s work; `lockstep.fallbacks` then holds the devices that fell back."""
        mine = self.selected(plan)
        crash = device_crashes(self.spec.faults, self.spec.fault_seed, plan.round, mine)
        if self._plain(plan, broadcast) and not crash.any():
            return self._train_plain(plan, broadcast, mine, lockstep)
        requests = []
        starts: dict[int, tuple[dict[str, np.ndarray], DeviceState]] = {}
        for dev, crashed in zip(mine.tolist(), crash):
            if crashed:
                continue
            held = plan.sensors_of(dev, self.pop.sensor_mask[dev])
            groups = self.groups_of(held, plan)
            try:
                start, state = self.start_vectors(plan, broadcast, dev, groups,
                                                  self.state_of(dev))
            except Exception:  # noqa: BLE001 - the sequential path records the failure
                continue
            starts[dev] = (start, state)  # `DeviceHost._train` reuses them
            requests.append(self._request(dev, groups, start, state, held))
        runs = lockstep.run(requests, plan.round, broadcast, plan.upload, plan.active_groups)
        return self._device_by_device(plan, broadcast, requests, runs, starts, lockstep)

    def _request(self, dev: int, groups: list[str], start: dict[str, np.ndarray] | None = None,
                 state: DeviceState = EMPTY, held: np.ndarray | None = None) -> Request:
        """Device `dev`'s lock-step work: its training rows and sensors (`held`: the ones it
        trains with this round, default all it holds), the groups it trains, its start vectors
        (None: the broadcast) and what it keeps."""
        held = self.pop.sensor_mask[dev] if held is None else held
        return Request(dev, self.pop.indices(dev), held, tuple(groups),
                       state.adapter, start, dict(state.objective) if state.objective else None)

    def _device_by_device(self, plan: RoundPlan, broadcast: Broadcast,
                          requests: list[Request], runs: list[ChunkRun],
                          starts: dict[int, tuple[dict[str, np.ndarray], DeviceState]],
                          lockstep: LockstepTrainer) -> HostResult:
        """`DeviceHost._train` with the outcomes of the devices that trained in lock-step (it
        trains the others sequentially)."""
        return self._train(plan, broadcast, starts, lockstep.outcomes(runs, plan.round))

    def _plain(self, plan: RoundPlan, broadcast: Broadcast) -> bool:
        """Whether every selected device just loads the broadcast, trains and uploads what it
        trained, keeping nothing and reporting nothing else: `training.exchange: params`
        without cluster models, no device state, no unimodal report, and an objective without
        an adapter, private blocks (`model.private`) or per-device hooks after training
        (`device_extras`, `device_finish`), and no privacy (each device clips and noises its
        own update in `DeviceHost._train`)."""
        objective = self.spec.objective
        return (self.spec.training.exchange == "params" and broadcast.clusters is None
                and not self.spec.privacy.on and plan.upload and not plan.report and not self.states
                and self.lockstep is not None and not self.lockstep.use_adapter
                and self.trainer.initial_private is None
                and not objective.overrides(Objective.device_extras)
                and not objective.overrides(Objective.device_finish))

    def _train_plain(self, plan: RoundPlan, broadcast: Broadcast, mine: np.ndarray,
                     lockstep: LockstepTrainer) -> HostResult:
        """A `_plain` round: the chunks' rows become the result's rows (reordered by id only
        where buckets interleave ids), as `DeviceHost._train` would stack them, without a
        `DeviceOutcome` per device. If a device did not train in lock-step (a bucket raised,
        or it has no samples), the round goes device by device after all."""
        masks = plan.training_masks(self.pop.sensor_mask[mine])
        requests = [self._request(dev, self.groups_of(masks[i], plan), held=masks[i])
                    for i, dev in enumerate(mine.tolist())]
        runs = lockstep.run(requests, plan.round, broadcast, active=plan.active_groups)
        if sum(len(run.reqs) for run in runs) < len(requests):
            return self._device_by_device(plan, broadcast, requests, runs, {}, lockstep)
        loss = np.empty(mine.shape[0], np.float64)
        parts: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
        for run in runs:
            devs = run.devices()
            loss[np.searchsorted(mine, devs)] = run.loss
            for g in run.groups:
                # in a bucket mixing sensor sets, only the devices that train the group send it
                sends = np.array([g in r.groups for r in run.reqs])
                if sends.any():
                    parts.setdefault(g, []).append((devs, run.flat[g]) if sends.all()
                                                   else (devs[sends], run.flat[g][sends]))
        updates, positions = {}, {}
        for g, got in parts.items():
            devs = np.concatenate([d for d, _ in got])
            mat = np.concatenate([m for _, m in got]) if len(got) > 1 else got[0][1]
            if np.any(devs[1:] < devs[:-1]):
                order = np.argsort(devs, kind="stable")
                devs, mat = devs[order], mat[order]
            updates[g], positions[g] = mat, np.searchsorted(mine, devs)
        return self._result(mine, updates, positions, loss, {}, [], [], {})
