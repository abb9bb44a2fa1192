"""The seams every method plugs into: Selector, Aggregator, Schedule, Objective.

Implementations live in the `policies` package (one small class per file, registered by name in
`raymm.registry`); the core only talks to these Protocols.

Any policy may also have two optional hooks for rules that involve the rest of the run:
`check_scenario(params, scenario, sensors) -> list[str]` (a staticmethod) returns every problem
of its parameters against the validated scenario and the dataset's sensors (None when the
dataset section is itself invalid, which is reported already); `raymm validate` reports them, so
`raymm run` refuses the scenario before it loads data or starts Ray. `bind(scenario, sensors)`
takes run-level facts (rounds, the sensors) when the run is built; whatever it refuses must be
in `check_scenario` (it raises those problems with `raymm.errors.refuse`), as
tests/unit/test_validate_covers_build.py checks for every registered policy.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from raymm.messages import UpdateBatch
from raymm.models.network import ModelOutput
from raymm.observations import Observations


@dataclass(frozen=True)
class SelectionContext:
    round: int
    online: np.ndarray        # sorted ids of the devices that reported online
    eligible: np.ndarray      # sorted subset of `online` the schedule lets take part
    k: int
    obs: Observations
    rng: np.random.Generator  # stream (seed, round, server, "selection")


@dataclass(frozen=True)
class EvalFeedback:
    """The headline accuracy of an evaluation (the pooled one, or the per-device mean with
    `eval.scope: devices`) and the run's totals at that round: what a policy that learns from
    outcomes (TIDE's adaptive weights) is shown."""

    round: int
    accuracy: float
    bytes_total: int
    sim_seconds: float


@dataclass(frozen=True)
class ModalityReport:
    """Per-modality accuracies that a round's participants report on their own training
    samples, before training, with the server's vectors (asked for by a schedule's
    `report_sensors`; see `raymm.device_eval.unimodal_correct`).

    `correct[i, j]`: device i's correct predictions with only sensor j present, -1 where it was
    not asked or does not hold j; `num_samples[i]`: the samples it evaluated.
    """

    round: int
    device_ids: np.ndarray   # int64 [n], sorted
    num_samples: np.ndarray  # int64 [n]
    correct: np.ndarray      # int32 [n, M]

    def accuracy(self) -> np.ndarray:
        """float [M]: Σ correct / Σ samples over the devices that reported each sensor (every
        sample weighs the same); NaN where nobody did."""
        has = self.correct >= 0
        n = (has * self.num_samples[:, None]).sum(axis=0).astype(np.float64)
        hits = np.where(has, self.correct, 0).sum(axis=0).astype(np.float64)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(n > 0, hits / np.maximum(n, 1), np.nan)


@runtime_checkable
class Selector(Protocol):
    """Who trains: return at most k sorted device ids from `ctx.eligible`.

    Optional: `observe_evaluation(EvalFeedback)` (learn from each evaluation's outcome),
    `round_stats() -> {name: number}` (columns of the round's row, e.g. the weights used),
    `state_dict()` / `load_state_dict(state)` (what a checkpoint must keep).
    """

    def select(self, ctx: SelectionContext) -> np.ndarray: ...


@dataclass(frozen=True)
class AggregationContext:
    round: int
    sensors: tuple[str, ...]
    obs: Observations
    seed: int


@runtime_checkable
class Aggregator(Protocol):
    """How updates combine. Owns its server state (e.g. prototypes, cluster models).

    Optional: `combinable = True` when the new vectors depend on the updates only through
    `UpdateBatch.weighted_mean` (hosts may then send whole id blocks pre-summed; see
    `raymm.combine`). Without it, every sender's row arrives in `batch.updates`.
    `takes_deltas = True`: uploads are deltas (`training.exchange: delta`). `personal = True`:
    no parameters travel, only extras (`training.exchange: personal`, FedProto).
    `cluster_models()`: per-device alternative models (`raymm.messages.ClusterModels`).
    `eval_extras()`: extras per-device evaluation needs (e.g. prototypes).
    `extras_uplink_bytes(batch)`: bytes each device's extras carry, when not their full size.
    """

    def aggregate(self, params: dict[str, np.ndarray], batch: UpdateBatch,
                  ctx: AggregationContext) -> dict[str, np.ndarray]:
        """Return the new global vector of every group (unchanged groups may be returned as is).
        Must not mutate `params` or `batch`."""
        ...

    def extras(self, round: int) -> dict[str, np.ndarray]:
        """Extra payload broadcast with the model this round (empty for most methods)."""
        ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class StatelessAggregator:
    """Mixin for aggregators without server state."""

    def extras(self, round: int) -> dict[str, np.ndarray]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        return None


@runtime_checkable
class Schedule(Protocol):
    """Which parameter groups are active in a round, and which devices may take part.

    Optional: `phase_span(round) -> (first, last)` (sync windows restart at each phase),
    `frozen_groups(round)` (groups read but not trained, sent once), `final_stage_start`
    (first round whose evaluations count toward early stopping: a staged method's last stage).
    A schedule that decides as it goes (the adaptive chain) may also have
    `begin_round(round, obs)` (called before eligibility), `report_sensors(round)` (sensors
    the participants report their unimodal accuracy for, counted as uplink),
    `observe(ModalityReport)`, `extras(round)` (broadcast with the model, counted as
    downlink), `round_stats()` and `state_dict()` / `load_state_dict(state)`.
    """

    def active_groups(self, round: int, groups: list[str]) -> tuple[str, ...]: ...

    def eligible(self, round: int, sensor_mask: np.ndarray,
                 sensors: tuple[str, ...]) -> np.ndarray:
        """bool per row of `sensor_mask`."""
        ...

    def phase(self, round: int) -> str: ...


@dataclass(frozen=True)
class LossInputs:
    """Everything a local objective may look at for one minibatch of one device."""

    out: ModelOutput
    y: Tensor
    present: Tensor                     # float [B, M]: sensor present in this sample
    held: tuple[str, ...]               # sensors the device holds
    trainable: Mapping[str, Tensor]     # parameter name -> live parameter being trained
    anchor: dict[str, Tensor]           # parameter name -> value received this round
    extras: dict[str, Tensor] = field(default_factory=dict)  # server extras, as tensors
    round: int = 0
    local: dict[str, Tensor] = field(default_factory=dict)   # from the `device_tensors` hook
    groups: tuple[str, ...] = ()        # parameter groups being trained this round
    #: float [B] sample weights on the vectorised path (1 = real sample, 0 = padding of a short
    #: last batch); None on the sequential path, where every row is real. See raymm.vectorised.
    weight: Tensor | None = None


def sample_mean(values: Tensor, weight: Tensor | None) -> Tensor:
    """Mean of per-sample `values` [B, ...] over the batch, padding rows (weight 0) excluded."""
    if weight is None:
        return values.mean(dim=0)
    w = weight.reshape((-1,) + (1,) * (values.dim() - 1))
    return (values * w).sum(dim=0) / weight.sum()


def mean_cross_entropy(logits: Tensor, y: Tensor, weight: Tensor | None) -> Tensor:
    """Cross-entropy averaged over the batch, padding rows (weight 0) excluded."""
    if weight is None:
        return F.cross_entropy(logits, y)
    return sample_mean(F.cross_entropy(logits, y, reduction="none"), weight)


#: logit offset that takes a padding row out of a contrastive loss's candidates: exp()
#: underflows to 0, yet it is finite so that 0-weight rows keep finite gradients (an infinite
#: logit would give NaN)
PADDING_LOGIT = -1e4


def contrastive_ce(sim: Tensor, weight: Tensor | None) -> Tensor:
    """InfoNCE core: mean_b -log softmax_b'(sim[b, b'])[b] for a square similarity [B, B] of
    anchors (rows) against candidates (columns), positives on the diagonal. With `weight`,
    padding rows are neither candidates (their column gets `PADDING_LOGIT`) nor anchors."""
    target = torch.arange(sim.shape[0], device=sim.device)
    if weight is not None:
        sim = sim + ((1.0 - weight) * PADDING_LOGIT)[None, :]
    return mean_cross_entropy(sim, target, weight)


@dataclass(frozen=True)
class DeviceFinish:
    """What the optional `Objective.device_finish` hook sees after one device's local training.

    `start`/`end` are the trained groups' flat vectors before and after; `state` is what the
    device kept from earlier rounds (see `raymm.exchange`); `steps` the optimizer steps taken.
    """

    device: int
    round: int
    groups: tuple[str, ...]
    start: dict[str, np.ndarray]
    end: dict[str, np.ndarray]
    state: dict[str, np.ndarray]
    extras: dict[str, np.ndarray]
    steps: int
    lr: float
    #: mean minibatch gradient per trained group over the local steps (filled only when the
    #: objective sets `needs_grad_mean = True`)
    grad_mean: dict[str, np.ndarray] = field(default_factory=dict)
    #: whether this round's extras reach the server (False between the syncs of a periodic
    #: exchange: what the hook returns as sent is dropped, so changes must be kept and sent
    #: summed at the next upload)
    upload: bool = True


@runtime_checkable
class Objective(Protocol):
    """The local loss. Written functionally (no in-place parameter updates, no data-dependent
    Python branches inside) so it can later be vmapped over devices.

    Optional hooks (looked up with getattr): `augment(...)`, `device_extras(...)`,
    `device_tensors(state, extras, layout, groups) -> dict[str, Tensor]` (tensors handed to
    every loss call as `LossInputs.local`, e.g. SCAFFOLD's control-variate correction) and
    `device_finish(DeviceFinish) -> (state updates, per-device uplink extras)` (what the device
    keeps for later rounds, e.g. its control variate, and what it sends besides its groups),
    `eval_predict(out, held, extras) -> {name: predictions}` (predictors besides the logits in
    per-device evaluation, reported as `acc_<name>`, e.g. FedProto's nearest prototype).
    Optional attribute `split_adapter = True` (with `uses_adapter`): trainers ask the model for
    the adapter-free task logits plus the adapter's own detached path
    (`ModelOutput.personal_logits`, see `MultimodalNet.forward`) instead of one path through it.
    """

    #: whether the device-local adapter is used when training
    uses_adapter: bool

    def loss(self, inp: LossInputs) -> Tensor: ...


def prox_term(inp: LossInputs) -> Tensor:
    """Squared L2 distance of the trained parameters to the ones received this round."""
    total = None
    for name, p in inp.trainable.items():
        d = ((p - inp.anchor[name]) ** 2).sum()
        total = d if total is None else total + d
    assert total is not None, "prox_term needs at least one trainable parameter"
    return total
