"""A host of simulated devices: what a DeviceActor wraps, and what the serial executor uses.

A host answers two questions per round: which of my devices are online (each device decides
from its own clock), and, for the selected ones, the trained updates, stacked into one
`HostResult`. What each device keeps between rounds (`raymm.protocol.device_state.DeviceState`)
stays here and never travels; `raymm.device.lockstep_host.make_host` picks the host class an
executor builds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from raymm.config.schema import EngineSpec, FaultSpec, ModelSpec, PrivacySpec, TrainingSpec
from raymm.data.base import Dataset
from raymm.device.evaluation import ExtraPredictor, evaluate_device, unimodal_correct
from raymm.models import LOCAL
from raymm.models.layout import BUFFERS, PRIVATE
from raymm.models.masked import evaluating
from raymm.phases import phase
from raymm.population.devices import Population
from raymm.population.faults import device_crashes
from raymm.protocol import combine, exchange, privacy
from raymm.protocol.combine import Partials
from raymm.protocol.device_state import EMPTY, DeviceState
from raymm.protocol.messages import (
    MODALITY_CORRECT,
    Broadcast,
    DeviceEval,
    HostResult,
    OnlineReport,
    RoundPlan,
)
from raymm.protocol.seams import Objective
from raymm.protocol.traffic import compute_seconds, device_groups, forward_seconds
from raymm.training.sequential import DeviceOutcome, SequentialTrainer


@dataclass(frozen=True)
class HostSpec:
    """What every host needs besides its device ids; picklable, sent once."""

    seed: int
    model: ModelSpec
    training: TrainingSpec
    objective: Objective
    faults: FaultSpec = FaultSpec()
    fault_seed: int = 0
    #: send whole id blocks pre-summed (`raymm.protocol.combine`): the aggregator needs only
    #: weighted sums and no deadline may drop devices after the fact
    combine: bool = False
    #: `execution.accelerator`: the torch device this host's devices train on
    #: (`raymm.training.accelerator`)
    accelerator: str = "auto"
    #: `execution.training`: lock-step or sequential, and the engine's other speed switches
    engine: EngineSpec = EngineSpec()
    #: `privacy`: each device clips (and in local mode noises) its update before it leaves
    privacy: PrivacySpec = PrivacySpec()


def stack_rows(rows: list[np.ndarray]) -> np.ndarray:
    """`np.stack(rows)`, or without a copy the rows themselves when they lie one after another
    in one buffer, in order, as lock-step training hands them out (`raymm.training.lockstep`): the
    copy is a few percent of a lock-step round at hundreds of devices."""
    first = rows[0] if rows else None
    if first is None or first.base is None or not first.flags.c_contiguous or \
            any(r.base is not first.base or r.shape != first.shape or r.dtype != first.dtype
                for r in rows):
        return np.stack(rows)
    at, step = first.__array_interface__["data"][0], first.nbytes
    if any(r.__array_interface__["data"][0] != at + i * step for i, r in enumerate(rows)):
        return np.stack(rows)
    # one base holds them all, back to back: a [n, ...] view of that memory
    return np.lib.stride_tricks.as_strided(first, (len(rows),) + first.shape,
                                           (step,) + first.strides)


def own_private(state: DeviceState, initial: np.ndarray) -> np.ndarray:
    """A device's private blocks: its own once it trained them, else the initial ones (every
    process builds them identically from the seed)."""
    return initial if state.private is None else state.private


class DeviceHost:
    def __init__(self, device_ids: np.ndarray, population: Population, dataset: Dataset,
                 spec: HostSpec, accelerator: str = "cpu") -> None:
        torch.set_num_threads(spec.engine.threads)
        self.ids = np.sort(np.asarray(device_ids, dtype=np.int64))
        # executors give hosts contiguous id ranges: then "mine" is one binary search
        self._range = (int(self.ids[0]), int(self.ids[-1]) + 1) if self.ids.size and \
            int(self.ids[-1]) - int(self.ids[0]) + 1 == self.ids.size else None
        self.pop = population
        self.spec = spec
        self.trainer = SequentialTrainer(dataset, spec.model, spec.training, spec.objective,
                                         spec.seed, accelerator)
        # what each device keeps between rounds (adapter, exchange vectors, objective state);
        # a device that keeps nothing has no entry
        self.states: dict[int, DeviceState] = {}
        # `device_groups` depends on the sensor mask and the plan only: computed once per
        # distinct (mask, active groups) instead of once per device (see `groups_of`)
        self._groups: dict[tuple[bytes, tuple[str, ...]], list[str]] = {}
        # clip_unit: group: each travelling group's share of C (for C = 1)
        layout = self.trainer.layout
        self._clip_shares = privacy.group_bounds(
            1.0, {g: layout.sizes[g] for g in layout.groups}, spec.privacy.group_split) \
            if spec.privacy.on and spec.privacy.clip_unit == "group" else None

    def groups_of(self, held: np.ndarray, plan: RoundPlan) -> list[str]:
        """`device_groups` of a device with sensor mask `held` this round (memoised)."""
        key = (held.tobytes(), plan.active_groups)
        hit = self._groups.get(key)
        if hit is None:
            if len(self._groups) > 64:  # schedules change active groups: keep it bounded
                self._groups.clear()
            hit = self._groups[key] = device_groups(held, self.pop.sensors, plan.active_groups,
                                                    self.spec.training.upload)
            if hit and self.trainer.initial_private is not None:
                hit.append(PRIVATE)   # a device that trains anything trains its own blocks
        return list(hit)

    def start_vectors(self, plan: RoundPlan, broadcast: Broadcast, dev: int,
                      groups: list[str], state: DeviceState
                      ) -> tuple[dict[str, np.ndarray], DeviceState]:
        """`exchange.start_vectors` of device `dev` (trained `groups`), plus its private
        blocks (`model.private`: its own once it trained them, else the initial ones), which
        are no part of any exchange."""
        tr = self.trainer
        start, state = exchange.start_vectors(self.spec.training.exchange, plan, broadcast, dev,
                                              [g for g in groups if g != PRIVATE], state,
                                              tr.initial)
        if tr.initial_private is not None:
            start = {**start, PRIVATE: own_private(state, tr.initial_private)}
        return start, state

    def report_online(self, t: int) -> OnlineReport:
        on = self.ids[self.pop.online(t, self.ids)]
        return OnlineReport(on, self.pop.num_samples[on].astype(np.int64))

    @phase("host.train.sequential")
    def train(self, plan: RoundPlan, broadcast: Broadcast) -> HostResult:
        """Train this host's selected devices in id order; a device that raises is recorded as
        failed (an error value), never propagated."""
        return self._train(plan, broadcast)

    def _train(self, plan: RoundPlan, broadcast: Broadcast,
               starts: Mapping[int, tuple[dict[str, np.ndarray], DeviceState]] | None = None,
               trained: Mapping[int, DeviceOutcome] | None = None) -> HostResult:
        """`train`, given what a subclass already computed this round for some devices: their
        start vectors (`exchange.start_vectors` is pure: the same answer, not computed twice)
        and their outcomes (trained in lock-step for this round's plan). The others train here,
        one after another; the bookkeeping (failures, device state, uploads) is the same."""
        starts, trained = starts or {}, trained or {}
        mine = self.selected(plan)
        crash = device_crashes(self.spec.faults, self.spec.fault_seed, plan.round, mine)
        self.trainer.prepare_round(plan.round, mine[~np.isin(mine, list(trained))]
                                   if trained else mine)
        done: list[int] = []
        outcomes = []
        reports: dict[int, np.ndarray] = {}
        failed, errors = [], []
        for dev, crashed in zip(mine.tolist(), crash):
            if crashed:  # its update and any local-state change of this round are lost
                failed.append(dev)
                errors.append(f"device {dev}: injected crash in round {plan.round}")
                continue
            try:
                start, state, sent, out = self._train_one(dev, plan, broadcast, starts.get(dev),
                                                          trained.get(dev), reports)
            except Exception as exc:  # noqa: BLE001 - a crashed device is data, not a crash
                failed.append(dev)
                errors.append(f"device {dev}: {type(exc).__name__}: {exc}")
                continue
            sent, out = self._settle(dev, plan, broadcast, start, state, sent, out)
            done.append(dev)
            outcomes.append((list(sent), out))
        return self._stack(np.array(done, np.int64), outcomes, failed, errors, reports)

    def _train_one(self, dev: int, plan: RoundPlan, broadcast: Broadcast,
                   known: tuple[dict[str, np.ndarray], DeviceState] | None,
                   trained: DeviceOutcome | None, reports: dict[int, np.ndarray]
                   ) -> tuple[dict[str, np.ndarray], DeviceState, dict[str, np.ndarray],
                              DeviceOutcome]:
        """One device's round up to what it would send: its modality report (into `reports`)
        when the plan asks, its start vectors and state (`known`: computed by the caller),
        its training (`trained`: done in lock-step), the objective's state merged in and the
        exchange's finish. Returns (start, state, sent, outcome); raises what the device
        raised."""
        held = plan.sensors_of(dev, self.pop.sensor_mask[dev])  # what it trains with
        groups = self.groups_of(held, plan)
        mode = self.spec.training.exchange
        if plan.report:
            reports[dev] = self._modality_report(dev, self.pop.sensor_mask[dev], plan,
                                                 broadcast)
        start, state = known if known is not None else self.start_vectors(
            plan, broadcast, dev, groups, self.state_of(dev))
        out = trained if trained is not None else self.trainer.train(
            dev, plan.round, self.pop.indices(dev), held, groups, broadcast,
            state.adapter, start, dict(state.objective), plan.upload, state.buffers)
        if PRIVATE in out.updates:  # the device keeps its trained blocks; they never travel
            updates = dict(out.updates)
            state = replace(state, private=np.array(updates.pop(PRIVATE), np.float32))
            out = replace(out, updates=updates)
        # the objective's state merges key by key (a hook may update some keys only)
        if out.state:
            state = replace(state, objective={**state.objective, **out.state})
        sent, state = exchange.finish(mode, plan, out.updates, state, self.trainer.initial)
        return start, state, sent, out

    def _settle(self, dev: int, plan: RoundPlan, broadcast: Broadcast,
                start: dict[str, np.ndarray], state: DeviceState, sent: dict[str, np.ndarray],
                out: DeviceOutcome) -> tuple[dict[str, np.ndarray], DeviceOutcome]:
        """A trained device keeps its state (adapter, statistics) and hands out what travels:
        clipped (and noised) under privacy, nothing at all in a round without upload."""
        if out.local is not None:
            state = replace(state, adapter=out.local)
        if out.buffers is not None:
            state = replace(state, buffers=out.buffers)
        self._keep(dev, state)
        if self.spec.privacy.on and plan.upload:
            sent, extra = privacy.privatize(
                self.spec.privacy, self.spec.seed, plan.round, dev, sent,
                start if self.spec.training.exchange == "params" else None,
                privacy.round_clip(self.spec.privacy, broadcast.extras),
                self._clip_shares, privacy.round_noise(broadcast.extras))
            out = replace(out, extras={**out.extras, **extra})
        # a round without upload (periodic sync, Local) sends nothing, extras included
        if sent is not out.updates or not plan.upload:
            out = replace(out, updates=sent, extras=out.extras if plan.upload else {})
        return sent, out

    def _modality_report(self, dev: int, held: np.ndarray, plan: RoundPlan,
                         broadcast: Broadcast) -> np.ndarray:
        """int32 [M]: the device's correct predictions on its own training samples with only
        sensor j present, for the held sensors the plan asks about (-1 elsewhere), with the
        server's vectors it holds (`exchange.eval_vectors`), before it trains."""
        tr, sensors = self.trainer, self.pop.sensors
        which = held & np.isin(np.array(sensors), plan.report)
        if not which.any():
            return np.full(len(sensors), -1, np.int32)
        idx = torch.from_numpy(self.pop.indices(dev).astype(np.int64))
        vectors = self._eval_vectors(broadcast, dev, self.state_of(dev))
        return unimodal_correct(tr.model, tr.layout, vectors,
                                {m: tr.rows(m, idx) for m in sensors}, tr.train_y[idx],
                                which)

    def _eval_vectors(self, payload: Broadcast, dev: int, state: DeviceState
                      ) -> dict[str, np.ndarray]:
        """The vectors device `dev` is evaluated with (`exchange.eval_vectors`), with its own
        batch-norm statistics when it keeps them."""
        tr = self.trainer
        vectors = exchange.eval_vectors(self.spec.training.exchange, payload, dev, state,
                                        tr.initial)
        if tr.initial_buffers is not None:
            vectors[BUFFERS] = tr.initial_buffers if state.buffers is None else state.buffers
        if tr.initial_private is not None:
            vectors[PRIVATE] = own_private(state, tr.initial_private)
        return vectors

    def selected(self, plan: RoundPlan) -> np.ndarray:
        """This host's devices among the selected ones, in id order."""
        if self._range is not None:
            lo, hi = np.searchsorted(plan.selected, self._range)
            return plan.selected[lo:hi]
        return plan.selected[np.isin(plan.selected, self.ids)]

    def _stack(self, ids: np.ndarray, outcomes: list, failed: list[int],
               errors: list[str], reports: dict[int, np.ndarray]) -> HostResult:
        updates: dict[str, list[np.ndarray]] = {}
        senders: dict[str, list[int]] = {}
        for row, (groups, out) in enumerate(outcomes):
            for g in groups:
                updates.setdefault(g, []).append(out.updates[g])
                senders.setdefault(g, []).append(row)
        extra_names = sorted({k for _, o in outcomes for k in o.extras})
        return self._result(
            ids, {g: stack_rows(v) for g, v in updates.items()},
            {g: np.array(v, np.int64) for g, v in senders.items()},
            np.array([o.loss for _, o in outcomes], dtype=np.float64),
            {k: np.stack([o.extras[k] for _, o in outcomes]) for k in extra_names},
            failed, errors, reports)

    def _result(self, ids: np.ndarray, rows: dict[str, np.ndarray],
                positions: dict[str, np.ndarray], loss: np.ndarray,
                extras: dict[str, np.ndarray], failed: list[int], errors: list[str],
                reports: dict[int, np.ndarray]) -> HostResult:
        """The `HostResult` of the devices `ids` that trained (sorted): each group's rows and
        their positions in `ids`, their losses and extras in id order."""
        n = self.pop.num_samples[ids].astype(np.int64)
        # a private sum counts every device once (user level), whatever its sample count
        weights = np.ones_like(n) if self.spec.privacy.on else n
        partials = self._presum(ids, weights, rows, positions) if self.spec.combine else {}
        reported = {MODALITY_CORRECT: np.stack([reports[int(d)] for d in ids])} \
            if reports and ids.size else {}
        # a report is one forward pass per reported sensor over the device's samples
        passes = (reported[MODALITY_CORRECT] >= 0).sum(axis=1) if reported else 0
        return HostResult(
            device_ids=ids, num_samples=n,
            compute_seconds=compute_seconds(n, self.spec.training.local_epochs,
                                            self.trainer.flops, self.pop.gflops[ids])
            + forward_seconds(n, passes, self.trainer.flops, self.pop.gflops[ids]),
            reports=reported, loss=loss, updates=rows, senders=positions, partials=partials,
            extras=extras, failed=np.array(failed, np.int64), errors=tuple(errors),
            # `_keep` holds non-empty states only, and their records are never None
            states={d: st.to_record() for d in ids.tolist()
                    if (st := self.states.get(d)) is not None})

    @phase("host.block_sums")
    def _presum(self, ids: np.ndarray, n: np.ndarray, rows: dict[str, np.ndarray],
                positions: dict[str, np.ndarray]) -> dict[str, Partials]:
        """Replace the rows of devices in id blocks this host holds whole by the blocks'
        partial sums (in place in `rows`/`positions`); the other rows travel as they are, and
        so does a block's only sender (its float64 sum would be twice the bytes of its row)."""
        if self._range is None:
            return {}
        first, last = combine.complete_blocks(*self._range, self.pop.n)
        out = {}
        for g in list(rows):
            pos = positions[g]
            block = ids[pos] // combine.BLOCK
            whole = (block >= first) & (block < last)
            _, inverse, counts = np.unique(block, return_inverse=True, return_counts=True)
            whole &= counts[inverse] >= 2
            if not whole.any():
                continue
            if whole.all():  # no gather: the common case of a host holding whole blocks
                blocks, sums, weights = combine.block_sums(rows[g], n[pos], ids[pos])
                out[g] = Partials(blocks, sums, weights, pos)
                del rows[g], positions[g]
                continue
            blocks, sums, weights = combine.block_sums(rows[g][whole], n[pos[whole]],
                                                       ids[pos[whole]])
            out[g] = Partials(blocks, sums, weights, pos[whole])
            rows[g], positions[g] = rows[g][~whole], pos[~whole]
        return out

    def evaluate_devices(self, payload: Broadcast) -> DeviceEval:
        """Every hosted device on its own test part, with the model it would use."""
        tr = self.trainer
        use_adapter = bool(self.spec.objective.uses_adapter and LOCAL in tr.layout.slots)
        predict = self.spec.objective.eval_predict
        extras = {k: torch.from_numpy(v) for k, v in payload.extras.items()}
        # per device: (test samples, correct, summed loss, correct per sensor, extra correct)
        rows: list[tuple[int, int, float, np.ndarray, dict[str, int]]] = []
        with evaluating(tr.model):   # once for all devices, not a walk over the modules each
            for dev in self.ids.tolist():
                rows.append(self._evaluate_one(dev, payload, use_adapter, predict, extras))
        names = sorted({k for r in rows for k in r[4]})
        return DeviceEval(self.ids.copy(), np.array([r[0] for r in rows], np.int64),
                          np.array([r[1] for r in rows], np.int64),
                          np.array([r[2] for r in rows], np.float64),
                          np.stack([r[3] for r in rows]).astype(np.int64),
                          {k: np.array([r[4].get(k, -1) for r in rows], np.int64)
                           for k in names})

    def _evaluate_one(self, dev: int, payload: Broadcast, use_adapter: bool,
                      predict: ExtraPredictor | None, extras: dict[str, torch.Tensor]
                      ) -> tuple[int, int, float, np.ndarray, dict[str, int]]:
        """Device `dev` on its own test part: (test samples, correct, summed loss, correct
        per sensor, extra correct)."""
        tr, sensors = self.trainer, self.pop.sensors
        idx = torch.from_numpy(self.pop.test_indices_of(dev).astype(np.int64))
        state = self.state_of(dev)
        vectors = self._eval_vectors(payload, dev, state)
        if use_adapter:
            vectors[LOCAL] = tr.adapter_start(state.adapter)
        if idx.shape[0] == 0:
            return 0, 0, 0.0, np.zeros(len(sensors), np.int64), {}
        xs = {m: tr.rows(m, idx) for m in sensors}
        return (idx.shape[0], *evaluate_device(tr.model, tr.layout, vectors, xs, tr.train_y[idx],
                                               self.pop.sensor_mask[dev], use_adapter, predict,
                                               extras))

    # --- device state: kept per device, persisted as records (checkpoints, actor restarts) --
    def state_of(self, dev: int) -> DeviceState:
        """What device `dev` keeps now (`EMPTY` when nothing)."""
        return self.states.get(dev, EMPTY)

    def _keep(self, dev: int, state: DeviceState) -> None:
        if state.is_empty():
            self.states.pop(dev, None)
        else:
            self.states[dev] = state

    def state_dict(self) -> dict[int, Any]:
        """Every hosted device's state as its record (`DeviceState.to_record`), by id."""
        return {d: rec for d in sorted(self.states)
                if (rec := self.states[d].to_record()) is not None}

    def load_state_dict(self, state: dict[int, Any]) -> None:
        """Replace the states of this host's devices by those in `state` (records by id)."""
        mine = set(self.ids.tolist())
        self.states = {}
        for k, rec in state.items():
            if int(k) in mine:
                self._keep(int(k), DeviceState.from_record(rec))
