"""A host of simulated devices: what a DeviceActor wraps, and what the serial executor uses.

A host answers two questions per round: which of my devices are online (each device decides
from its own clock), and, for the selected ones, the trained updates, stacked into one
`HostResult`. Device-local state (e.g. a residual adapter) stays here and never travels.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from raymm import exchange
from raymm.accounting import compute_seconds, device_groups
from raymm.config import ModelSpec, TrainingSpec
from raymm.data.base import Dataset
from raymm.local import LocalTrainer
from raymm.device_eval import evaluate_device
from raymm.messages import Broadcast, DeviceEval, HostResult, OnlineReport, RoundPlan
from raymm.models import LOCAL
from raymm.policy import Objective
from raymm.population import Population


@dataclass(frozen=True)
class HostSpec:
    """What every host needs besides its device ids; picklable, sent once."""

    seed: int
    model: ModelSpec
    training: TrainingSpec
    objective: Objective


class DeviceHost:
    def __init__(self, device_ids: np.ndarray, population: Population, dataset: Dataset,
                 spec: HostSpec) -> None:
        torch.set_num_threads(spec.training.threads)
        self.ids = np.sort(np.asarray(device_ids, dtype=np.int64))
        self.pop = population
        self.spec = spec
        self.trainer = LocalTrainer(dataset, spec.model, spec.training, spec.objective, spec.seed)
        self.local_state: dict[int, np.ndarray] = {}
        # what each device keeps between rounds besides its adapter (raymm.exchange, objective
        # hooks): own parameters, bases, control variates; never leaves the host
        self.device_state: dict[int, dict[str, np.ndarray]] = {}

    def report_online(self, t: int) -> OnlineReport:
        on = self.ids[self.pop.online(t, self.ids)]
        return OnlineReport(on, self.pop.num_samples[on].astype(np.int64))

    def train(self, plan: RoundPlan, broadcast: Broadcast) -> HostResult:
        """Train this host's selected devices in id order; a device that raises is recorded as
        failed (an error value), never propagated."""
        mine = plan.selected[np.isin(plan.selected, self.ids)]
        done: list[int] = []
        outcomes = []
        failed, errors = [], []
        for dev in mine.tolist():
            held = self.pop.sensor_mask[dev]
            groups = device_groups(held, self.pop.sensors, plan.active_groups,
                                   self.spec.training.upload)
            mode = self.spec.training.exchange
            try:
                start, state = exchange.start_vectors(mode, plan, broadcast, dev, groups,
                                                      self.device_state.get(dev, {}),
                                                      self.trainer.initial)
                out = self.trainer.train(dev, plan.round, self.pop.indices(dev), held, groups,
                                         broadcast, self.local_state.get(dev), start, state)
                sent, state = exchange.finish(mode, plan, out.updates, {**state, **out.state},
                                              self.trainer.initial)
            except Exception as exc:  # noqa: BLE001 - a crashed device is data, not a crash
                failed.append(dev)
                errors.append(f"device {dev}: {type(exc).__name__}: {exc}")
                continue
            if out.local is not None:
                self.local_state[dev] = out.local
            if state:
                self.device_state[dev] = state
            done.append(dev)
            # a round without upload (periodic sync, Local) sends nothing, extras included
            outcomes.append((list(sent), replace(out, updates=sent, extras=out.extras
                                                 if plan.upload else {})))
        return self._stack(np.array(done, np.int64), outcomes, failed, errors)

    def _stack(self, ids: np.ndarray, outcomes: list, failed: list[int],
               errors: list[str]) -> HostResult:
        updates: dict[str, list[np.ndarray]] = {}
        senders: dict[str, list[int]] = {}
        for row, (groups, out) in enumerate(outcomes):
            for g in groups:
                updates.setdefault(g, []).append(out.updates[g])
                senders.setdefault(g, []).append(row)
        extra_names = sorted({k for _, o in outcomes for k in o.extras})
        n = self.pop.num_samples[ids].astype(np.int64)
        return HostResult(
            device_ids=ids, num_samples=n,
            compute_seconds=compute_seconds(n, self.spec.training.local_epochs,
                                            self.trainer.flops, self.pop.gflops[ids]),
            loss=np.array([o.loss for _, o in outcomes], dtype=np.float64),
            updates={g: np.stack(v) for g, v in updates.items()},
            senders={g: np.array(v, np.int64) for g, v in senders.items()},
            extras={k: np.stack([o.extras[k] for _, o in outcomes]) for k in extra_names},
            failed=np.array(failed, np.int64), errors=tuple(errors))

    def evaluate_devices(self, payload: Broadcast) -> DeviceEval:
        """Every hosted device on its own test part, with the model it would use."""
        tr, sensors = self.trainer, self.pop.sensors
        use_adapter = bool(self.spec.objective.uses_adapter and LOCAL in tr.layout.slots)
        rows = []
        for dev in self.ids.tolist():
            idx = torch.from_numpy(self.pop.test_indices_of(dev).astype(np.int64))
            held = self.pop.sensor_mask[dev]
            vectors = exchange.eval_vectors(self.spec.training.exchange, payload, dev,
                                            self.device_state.get(dev, {}), tr.initial)
            if use_adapter:
                local = self.local_state.get(dev)
                vectors[LOCAL] = local if local is not None else tr.initial_local
            if idx.shape[0] == 0:
                rows.append((0, 0, 0.0, np.zeros(len(sensors), np.int64)))
                continue
            xs = {m: tr.train_x[m][idx] for m in sensors}
            rows.append((idx.shape[0], *evaluate_device(tr.model, tr.layout, vectors, xs,
                                                        tr.train_y[idx], held, use_adapter)))
        return DeviceEval(self.ids.copy(), np.array([r[0] for r in rows], np.int64),
                          np.array([r[1] for r in rows], np.int64),
                          np.array([r[2] for r in rows], np.float64),
                          np.stack([r[3] for r in rows]).astype(np.int64))

    # --- persistence of device-local state (checkpoints) ---------------------------------
    def state_dict(self) -> dict[int, Any]:
        """Per device: its adapter vector, or (when it keeps more, see `device_state`) a dict
        of named arrays with the adapter under "local"."""
        out: dict[int, Any] = dict(self.local_state)
        for dev, st in self.device_state.items():
            out[dev] = {**st, **({LOCAL: self.local_state[dev]} if dev in self.local_state
                                 else {})}
        return out

    def load_state_dict(self, state: dict[int, Any]) -> None:
        mine = set(self.ids.tolist())
        self.local_state, self.device_state = {}, {}
        for k, v in state.items():
            if int(k) not in mine:
                continue
            if isinstance(v, dict):
                v = dict(v)
                if LOCAL in v:
                    self.local_state[int(k)] = v.pop(LOCAL)
                self.device_state[int(k)] = v
            else:
                self.local_state[int(k)] = v
