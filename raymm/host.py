"""A host of simulated devices: what a DeviceActor wraps, and what the serial executor uses.

A host answers two questions per round: which of my devices are online (each device decides
from its own clock), and, for the selected ones, the trained updates, stacked into one
`HostResult`. Device-local state (e.g. a residual adapter) stays here and never travels.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from raymm.accounting import compute_seconds, device_groups
from raymm.config import FaultSpec, ModelSpec, TrainingSpec
from raymm.data.base import Dataset
from raymm.faults import device_crashes
from raymm.local import LocalTrainer
from raymm.messages import Broadcast, HostResult, OnlineReport, RoundPlan
from raymm.policy import Objective
from raymm.population import Population


@dataclass(frozen=True)
class HostSpec:
    """What every host needs besides its device ids; picklable, sent once."""

    seed: int
    model: ModelSpec
    training: TrainingSpec
    objective: Objective
    faults: FaultSpec = FaultSpec()
    fault_seed: int = 0


class DeviceHost:
    def __init__(self, device_ids: np.ndarray, population: Population, dataset: Dataset,
                 spec: HostSpec, device: str = "cpu") -> None:
        torch.set_num_threads(spec.training.threads)
        self.ids = np.sort(np.asarray(device_ids, dtype=np.int64))
        self.pop = population
        self.spec = spec
        self.trainer = LocalTrainer(dataset, spec.model, spec.training, spec.objective, spec.seed,
                                    device)
        self.local_state: dict[int, np.ndarray] = {}

    def report_online(self, t: int) -> OnlineReport:
        on = self.ids[self.pop.online(t, self.ids)]
        return OnlineReport(on, self.pop.num_samples[on].astype(np.int64))

    def train(self, plan: RoundPlan, broadcast: Broadcast) -> HostResult:
        """Train this host's selected devices in id order; a device that raises is recorded as
        failed (an error value), never propagated."""
        mine = self.selected(plan)
        crash = device_crashes(self.spec.faults, self.spec.fault_seed, plan.round, mine)
        done: list[int] = []
        outcomes = []
        failed, errors = [], []
        for dev, crashed in zip(mine.tolist(), crash):
            if crashed:  # its update and any local-state change of this round are lost
                failed.append(dev)
                errors.append(f"device {dev}: injected crash in round {plan.round}")
                continue
            held = self.pop.sensor_mask[dev]
            groups = device_groups(held, self.pop.sensors, plan.active_groups,
                                   self.spec.training.upload)
            try:
                out = self.trainer.train(dev, plan.round, self.pop.indices(dev), held, groups,
                                         broadcast, self.local_state.get(dev))
            except Exception as exc:  # noqa: BLE001 - a crashed device is data, not a crash
                failed.append(dev)
                errors.append(f"device {dev}: {type(exc).__name__}: {exc}")
                continue
            if out.local is not None:
                self.local_state[dev] = out.local
            done.append(dev)
            outcomes.append((groups, out))
        return self._stack(np.array(done, np.int64), outcomes, failed, errors)

    def selected(self, plan: RoundPlan) -> np.ndarray:
        """This host's devices among the selected ones, in id order."""
        return plan.selected[np.isin(plan.selected, self.ids)]

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
            failed=np.array(failed, np.int64), errors=tuple(errors),
            states={int(d): self.local_state[int(d)] for d in ids
                    if int(d) in self.local_state})

    # --- persistence of device-local state (checkpoints, actor restarts) -------------------
    def state_dict(self) -> dict[int, np.ndarray]:
        return dict(self.local_state)

    def load_state_dict(self, state: dict[int, np.ndarray]) -> None:
        """Replace the state of this host's devices with theirs in `state` (others ignored)."""
        own = set(self.ids.tolist())
        self.local_state = {int(k): v for k, v in state.items() if int(k) in own}
