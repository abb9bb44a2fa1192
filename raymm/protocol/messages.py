"""Frozen values that cross the server/device boundary (and Ray's object store).

Per-device numbers are stacked into arrays, one message per host per round, so that a round
with a thousand selected devices costs a handful of objects, not a thousand.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from raymm.protocol import combine
from raymm.protocol.combine import Partials
from raymm.protocol.device_state import StateRecord

#: `HostResult.reports` entry answering `RoundPlan.report`: int32 [n, M], correct predictions
#: on the device's own training samples with only sensor j present, -1 where not reported
MODALITY_CORRECT = "modality_correct"


@dataclass(frozen=True)
class OnlineReport:
    """What a host tells the server at the start of a round: which of its devices are online.

    The clock (D, d, φ) stays on the device; only the answer and the data size travel.
    """

    device_ids: np.ndarray   # int64, sorted
    num_samples: np.ndarray  # int64, same order


@dataclass(frozen=True)
class RoundPlan:
    """Who trains this round and which parameter groups are active."""

    round: int
    selected: np.ndarray              # int64 device ids, sorted
    active_groups: tuple[str, ...]    # groups the schedule trains this round
    #: who receives the server's vectors of the groups it trains: one flag for every selected
    #: device, or a bool array aligned with `selected`. With periodic sync
    #: (training.exchange: delta) a device downloads at its first selection in a sync window.
    download: bool | np.ndarray = True
    #: periodic sync: selected devices upload only in the last round of a sync window
    upload: bool = True
    #: sensors whose unimodal accuracy the participants report (held ones only), measured
    #: before training on their own training samples with the server's vectors
    #: (`MODALITY_CORRECT`); empty for most rounds and methods
    report: tuple[str, ...] = ()
    #: bool [n_selected, M] aligned with `selected`: the sensors each device trains with this
    #: round (the selector's `train_sensors`, already within what it holds); None: every
    #: sensor it holds
    train_sensors: np.ndarray | None = None

    def sensors_of(self, device: int, held: np.ndarray) -> np.ndarray:
        """Selected `device`'s sensor mask for training this round, given the mask it holds."""
        if self.train_sensors is None:
            return held
        row: npt.NDArray[np.bool_] = self.train_sensors[int(np.searchsorted(self.selected,
                                                                            device))]
        return held & row

    def training_masks(self, held: np.ndarray) -> np.ndarray:
        """`sensors_of` for every selected device at once: `held` is [n_selected, M]."""
        return held if self.train_sensors is None else held & self.train_sensors

    def downloads(self, device: int) -> bool:
        """Whether selected `device` receives the server's vectors this round."""
        if isinstance(self.download, (bool, np.bool_)):
            return bool(self.download)
        return bool(self.download[int(np.searchsorted(self.selected, device))])

    def download_mask(self) -> np.ndarray:
        """bool per selected device (aligned with `selected`)."""
        mask: npt.NDArray[np.bool_] = np.broadcast_to(np.asarray(self.download, bool),
                                                      self.selected.shape).copy()
        return mask


@dataclass(frozen=True)
class ClusterModels:
    """K alternative models per group (SSCA) and which one each device is assigned.

    `params[g]` is float32 [K, P]; `assignment[g]` int64 [n_devices] is the model index k_i of
    a device's cluster; `clustered[g]` bool [n_devices] says whether it was clustered yet (a
    device never clustered trains from and evaluates with the consensus, i.e. the group's
    global vector).
    """

    params: dict[str, np.ndarray]
    assignment: dict[str, np.ndarray]
    clustered: dict[str, np.ndarray]


@dataclass(frozen=True)
class Broadcast:
    """The server's payload for one round, put in the object store once.

    `params[group]` is the global vector of an active group; `clusters` optionally holds
    per-device alternatives (cluster models); `extras` carries e.g. prototypes.
    """

    round: int
    params: dict[str, np.ndarray]
    extras: dict[str, np.ndarray] = field(default_factory=dict)
    clusters: ClusterModels | None = None

    def vector(self, group: str, device: int) -> np.ndarray:
        """The vector of `group` meant for `device`, to train from and to evaluate with: its
        cluster's model once it was clustered in that group, else the global vector."""
        c = self.clusters
        if c is None or group not in c.params or not c.clustered[group][device]:
            return self.params[group]
        row: npt.NDArray[np.float32] = c.params[group][int(c.assignment[group][device])]
        return row


def plan_state(plan: RoundPlan, broadcast: Broadcast) -> dict[str, Any]:
    """A plan and its payload as plain data (`raymm.io.statefile` stores it in a checkpoint)."""
    b = {"round": broadcast.round, "params": dict(broadcast.params),
         "extras": dict(broadcast.extras),
         "clusters": None if broadcast.clusters is None else asdict(broadcast.clusters)}
    return {"plan": asdict(plan), "broadcast": b}


def plan_from_state(state: dict[str, Any]) -> tuple[RoundPlan, Broadcast]:
    """The inverse of `plan_state`."""
    p, b = state["plan"], state["broadcast"]
    download = p["download"]
    plan = RoundPlan(int(p["round"]), np.asarray(p["selected"], np.int64),
                     tuple(p["active_groups"]),
                     bool(download) if isinstance(download, (bool, np.bool_))
                     else np.asarray(download, bool),
                     bool(p["upload"]), tuple(p["report"]),
                     None if p.get("train_sensors") is None
                     else np.asarray(p["train_sensors"], bool))
    c = b["clusters"]
    clusters = None if c is None else ClusterModels(
        {g: np.asarray(v, np.float32) for g, v in c["params"].items()},
        {g: np.asarray(v, np.int64) for g, v in c["assignment"].items()},
        {g: np.asarray(v, bool) for g, v in c["clustered"].items()})
    return plan, Broadcast(int(b["round"]), dict(b["params"]), dict(b["extras"]), clusters)


@dataclass(frozen=True)
class HostResult:
    """Everything one host's selected devices return in one round.

    `updates[group]` stacks the trained vectors of the devices that uploaded that group, and
    `senders[group]` gives their row positions in `device_ids`. When the aggregator only needs
    weighted sums, the devices of whole id blocks arrive pre-summed in `partials[group]`
    instead (see `raymm.protocol.combine`). `failed` lists devices that crashed before returning (an
    error as a value, not an exception).
    """

    device_ids: np.ndarray              # int64 [n], sorted
    num_samples: np.ndarray             # int64 [n]
    compute_seconds: np.ndarray         # float64 [n], simulated local-training time
    loss: np.ndarray                    # float64 [n], mean training loss
    updates: dict[str, np.ndarray]      # group -> float32 [n_g, P_g]
    senders: dict[str, np.ndarray]      # group -> int64 [n_g] row positions
    extras: dict[str, np.ndarray] = field(default_factory=dict)  # name -> [n, ...]
    failed: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    errors: tuple[str, ...] = ()
    #: device-local state after this round of the devices that trained. Not traffic: the
    #: simulator's copy of each device's own storage, so a restarted actor gets it back.
    states: dict[int, StateRecord] = field(default_factory=dict)
    partials: dict[str, Partials] = field(default_factory=dict)
    #: small per-device statistics the server asked for (`RoundPlan.report`): name -> [n, ...],
    #: negative entries meaning "not reported"; counted as uplink
    reports: dict[str, np.ndarray] = field(default_factory=dict)
    #: devices whose lock-step program raised, so that they trained sequentially, by reason
    #: (`raymm.training.lockstep`): the same numbers, slower. Not traffic: the simulator's own
    lockstep_fallbacks: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class DeviceEval:
    """One host's devices evaluated on their own test parts (`eval.scope: devices`).

    `correct_only[:, j]` counts correct predictions with only sensor j present (MIR); a row
    with `n_test == 0` is a device without test samples.
    """

    device_ids: np.ndarray      # int64 [n], sorted
    n_test: np.ndarray          # int64 [n]
    correct: np.ndarray         # int64 [n], with the sensors the device holds
    loss_sum: np.ndarray        # float64 [n], summed cross-entropy with held sensors
    correct_only: np.ndarray    # int64 [n, M]
    #: name -> int64 [n]: correct predictions of the objective's other predictors
    #: (`eval_predict`, e.g. FedProto's nearest prototype); -1 where a device had none
    extra_correct: dict[str, np.ndarray] = field(default_factory=dict)


@dataclass(frozen=True)
class UpdateBatch:
    """All hosts' results merged and sorted by device id: the aggregators' input."""

    device_ids: np.ndarray
    num_samples: np.ndarray
    compute_seconds: np.ndarray
    loss: np.ndarray
    updates: dict[str, np.ndarray]
    senders: dict[str, np.ndarray]
    extras: dict[str, np.ndarray]
    failed: np.ndarray
    errors: tuple[str, ...]
    #: group -> block partials of pre-summed senders (only for aggregators that declare
    #: `combinable`); their rows are not in `updates`
    partials: dict[str, Partials] = field(default_factory=dict)
    #: name -> [n, ...]: what devices reported besides their updates (`HostResult.reports`)
    reports: dict[str, np.ndarray] = field(default_factory=dict)
    #: group -> the group's mean, already formed (a private round: the noised sum over the
    #: fixed denominator, `raymm.server.privacy`); its rows are not in `updates`
    means: dict[str, np.ndarray] = field(default_factory=dict)
    #: every host's `HostResult.lockstep_fallbacks`, summed by reason
    lockstep_fallbacks: dict[str, int] = field(default_factory=dict)

    @property
    def n(self) -> int:
        return int(self.device_ids.shape[0])

    def groups(self) -> list[str]:
        """Every group somebody sent, as rows or pre-summed (every group a private round
        releases)."""
        return sorted(set(self.updates) | set(self.partials) | set(self.means))

    def sums(self, group: str, weights: np.ndarray | None = None
             ) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """The block partials of `group`'s senders (rows summed here with `weights`, default
        sample counts; pre-summed blocks as they came)."""
        parts = []
        if group in self.updates:
            w = self.group_weights(group) if weights is None else weights
            parts.append(combine.block_sums(self.updates[group], w,
                                            self.device_ids[self.senders[group]]))
        if group in self.partials:
            p = self.partials[group]
            parts.append((p.blocks, p.sums, p.weights))
        return parts

    def sent(self, group: str) -> np.ndarray:
        """Positions of every device that sent `group` (rows and pre-summed)."""
        rows = self.senders.get(group, np.zeros(0, np.int64))
        part = self.partials.get(group)
        return rows if part is None else np.sort(np.concatenate([rows, part.senders]))

    def weighted_mean(self, group: str, weights: np.ndarray | None = None
                      ) -> np.ndarray | None:
        """Σ w·x / Σ w of `group` over its senders in the canonical block order of
        `raymm.protocol.combine` (so pre-summed and row senders give the same numbers); `weights`
        (default: sample counts) are per row, and only rows can take custom weights. None when
        the weights sum to zero. A private round's mean is returned as formed."""
        if group in self.means:
            if weights is not None:
                raise ValueError(f"{group}: a private round's mean is formed with equal "
                                 "weights; an aggregator cannot weight its rows")
            return self.means[group]
        if group in self.partials and weights is not None:
            raise ValueError(f"{group}: custom weights need every sender's row, but some "
                             "arrived pre-summed (the aggregator declared `combinable`)")
        parts = self.sums(group, weights)
        return combine.mean_of(parts) if parts else None

    def subset(self, keep: np.ndarray) -> UpdateBatch:
        """Only the rows where `keep` is True (e.g. without stragglers); order preserved."""
        if self.partials:
            raise ValueError("cannot drop devices that arrived pre-summed")
        new_pos = np.cumsum(keep) - 1
        updates, senders = {}, {}
        for g, rows in self.senders.items():
            k = keep[rows]
            updates[g], senders[g] = self.updates[g][k], new_pos[rows[k]].astype(np.int64)
        return UpdateBatch(self.device_ids[keep], self.num_samples[keep],
                           self.compute_seconds[keep], self.loss[keep], updates, senders,
                           {k: v[keep] for k, v in self.extras.items()}, self.failed, self.errors,
                           reports={k: v[keep] for k, v in self.reports.items()},
                           lockstep_fallbacks=self.lockstep_fallbacks)

    def group_weights(self, group: str) -> np.ndarray:
        """Sample counts of the devices that sent `group`, in row order."""
        counts: npt.NDArray[np.float64] = self.num_samples[self.senders[group]].astype(np.float64)
        return counts


def merge_results(results: list[HostResult]) -> UpdateBatch:
    """Concatenate host results and sort every per-device array by device id.

    Sorting makes aggregation independent of how devices were packed into hosts. A host that
    returned no update (none of its devices selected, or all of them failed) adds no rows; its
    failures still count.
    """
    failed = np.sort(np.concatenate([r.failed for r in results])) if results \
        else np.zeros(0, np.int64)
    errors = tuple(e for r in results for e in r.errors)
    fallbacks: dict[str, int] = {}
    for r in results:
        for why, n in r.lockstep_fallbacks.items():
            fallbacks[why] = fallbacks.get(why, 0) + n
    results = [r for r in results if r.device_ids.shape[0]]
    ids = np.concatenate([r.device_ids for r in results]) if results else np.zeros(0, np.int64)
    order = np.argsort(ids, kind="stable")
    rank = np.empty_like(order)
    rank[order] = np.arange(order.shape[0])

    def cat(per_host: list[np.ndarray]) -> np.ndarray:
        return np.concatenate(per_host)[order] if results else np.zeros(0)

    offsets = np.cumsum([0] + [r.device_ids.shape[0] for r in results])
    groups = sorted({g for r in results for g in r.updates})
    updates, senders = {}, {}
    for g in groups:
        rows = [(rank[offsets[h] + r.senders[g]], r.updates[g])
                for h, r in enumerate(results) if g in r.updates]
        pos = np.concatenate([p for p, _ in rows]).astype(np.int64)
        mat = np.concatenate([m for _, m in rows]) if len(rows) > 1 else rows[0][1]
        if pos.size > 1 and not np.all(pos[1:] > pos[:-1]):  # hosts out of id order
            o = np.argsort(pos, kind="stable")
            pos, mat = pos[o], mat[o]
        senders[g], updates[g] = pos, mat
    extra_names = sorted({k for r in results for k in r.extras})
    extras = {k: cat([r.extras[k] for r in results]) for k in extra_names}
    reports = {k: cat([r.reports[k] for r in results])
               for k in sorted({k for r in results for k in r.reports})}
    partials = {}
    for g in sorted({g for r in results for g in r.partials}):
        parts = [(h, r.partials[g]) for h, r in enumerate(results) if g in r.partials]
        blocks = np.concatenate([p.blocks for _, p in parts])
        o = np.argsort(blocks, kind="stable")
        partials[g] = Partials(
            blocks[o], np.concatenate([p.sums for _, p in parts])[o],
            np.concatenate([p.weights for _, p in parts])[o],
            np.sort(np.concatenate([rank[offsets[h] + p.senders] for h, p in parts])))
    return UpdateBatch(
        device_ids=ids[order].astype(np.int64), num_samples=cat([r.num_samples for r in results]),
        compute_seconds=cat([r.compute_seconds for r in results]),
        loss=cat([r.loss for r in results]),
        updates=updates, senders=senders, extras=extras,
        failed=failed, errors=errors, partials=partials, reports=reports,
        lockstep_fallbacks=fallbacks)
