"""BMSFed's server side (Fan et al., ECCV 2024, arXiv 2401.00403): per-modality averaging,
global class prototypes, and the per-device statistics its selection reads.

- Parameters: each group's sample-weighted mean over the devices that sent it (with
  `training.upload: held`, a sensor's encoder over the devices that trained with that sensor
  this round; the fusion/`shared` part over all), as `fedavg`.
- Prototypes: P^m_c = Σ_i n^m_{i,c} μ^m_{i,c} / Σ_i n^m_{i,c} over this round's devices that
  trained with sensor m (μ their class means, n the counts, `policies.objective.bmsfed`); a
  class nobody reported keeps its prototype. Broadcast as `bmsfed/proto` [M, C, E] with
  `bmsfed/proto_ok` [M, C], from the round after the first aggregation on.
- Per-device statistics for selection (`selection_view`, read by selection `bmsfed`): each
  device's last update of each sensor's group, g^m_i = θ^m_server − θ^m_i (the negated delta
  under `training.exchange: delta`), kept as the pairwise distance matrices
  D^m_{ij} = ||g^m_i − g^m_j|| (the rows of this round's senders recomputed), which devices
  have sent any update (`known`), and the imbalance ratio b_i = acc^a_i / acc^b_i of the
  nearest-class-mean accuracies a multimodal device reported after training with both.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from policies.aggregation.fedavg import FedAvg
from policies.objective.bmsfed import CORRECT, COUNTS, MEANS, PROTO, PROTO_OK
from raymm.config.schema import Scenario
from raymm.errors import refuse
from raymm.protocol.messages import UpdateBatch
from raymm.protocol.registry import AGGREGATORS
from raymm.protocol.seams import AggregationContext
from raymm.units import FLOAT_BYTES

#: published names (`selection_view`): known [N] bool, ratio [N] (NaN: none yet), and the
#: distance matrix of every sensor, `dist/<m>` [N, N]
KNOWN, RATIO, DIST = "known", "ratio", "dist/"


def merge_prototypes(means: np.ndarray, counts: np.ndarray, protos: np.ndarray,
                     ok: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """New (prototypes [M, C, E] float32, has-prototype [M, C] bool) from n devices' class
    means [n, M, C, E] and counts [n, M, C]: the count-weighted mean where any device reported
    the class, else the old prototype. Sums over devices in row order (numpy, not BLAS)."""
    n = counts.astype(np.float64)
    total = n.sum(axis=0)                                                    # [M, C]
    mean = (means.astype(np.float64) * n[..., None]).sum(axis=0) / \
        np.maximum(total, 1.0)[..., None]
    seen = total > 0
    return np.where(seen[..., None], mean, protos).astype(np.float32), ok | seen


def imbalance_ratio(correct: np.ndarray) -> np.ndarray:
    """b_i = correct_a / correct_b per row of `correct` [n, 2] (equal sample counts, so the
    accuracies' ratio); NaN where a sensor was not reported (-1); +inf where only a is right
    at all, 1 where neither is."""
    a, b = correct[:, 0].astype(np.float64), correct[:, 1].astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(b > 0, a / np.maximum(b, 1.0), np.where(a > 0, np.inf, 1.0))
    return np.where((a >= 0) & (b >= 0), ratio, np.nan)


def distance_rows(vectors: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """||vectors[r] − vectors[j]|| for every r in `rows` and every j: [len(rows), N], float64.
    One row at a time (memory N·P, not rows·N·P), each a numpy reduction (the same numbers
    in the driver and in a Ray actor): the float32 difference, squared in float64. Row k
    computes only the columns not among rows[:k] and copies the others from the rows before
    it: the float32 difference only changes sign, so D_{rj} and D_{jr} are the same bits."""
    out = np.empty((len(rows), vectors.shape[0]), np.float64)
    todo = np.ones(vectors.shape[0], bool)
    order = rows.tolist()
    for k, r in enumerate(order):
        cols = np.flatnonzero(todo)
        diff = vectors[cols] - vectors[r]
        out[k, cols] = np.sqrt(np.square(diff, dtype=np.float64).sum(axis=1))
        out[k, order[:k]] = out[:k, r]
        todo[r] = False
    return out


@AGGREGATORS.register("bmsfed")
class BMSFedAggregation(FedAvg):
    """Per-group sample-weighted mean; prototypes; update distances and imbalance ratios for
    selection `bmsfed`."""

    # not `combinable`: the update distances read every sender's row

    def __init__(self, params: object) -> None:
        super().__init__(params)
        self.sensors: tuple[str, ...] = ()
        self.protos: np.ndarray | None = None      # [M, C, E]
        self.ok: np.ndarray | None = None          # [M, C] bool
        self.vectors: dict[str, np.ndarray] = {}   # sensor -> [N, P_m] last update
        self.dist: dict[str, np.ndarray] = {}      # sensor -> [N, N]
        self.known = np.zeros(0, bool)
        self.ratio = np.zeros(0, np.float64)
        #: keep the update vectors and their distances: only selection `bmsfed` reads them
        self.tracks_updates = True

    @staticmethod
    def check_scenario(params: object, scenario: Scenario,
                       sensors: tuple[str, ...] | None) -> list[str]:
        problems = []
        if scenario.objective.name != "bmsfed":
            problems.append("aggregation.name: bmsfed merges the prototypes that objective "
                            f"bmsfed reports (got objective {scenario.objective.name!r})")
        if scenario.training.upload != "held":
            problems.append("training.upload: BMSFed averages each modality's encoder over "
                            "the devices that trained it; set training.upload: held")
        if sensors is not None and len(sensors) != 2:
            problems.append(f"aggregation.name: bmsfed balances two modalities; the dataset "
                            f"has {len(sensors)} sensors")
        return problems

    def bind(self, scenario: Scenario, sensors: tuple[str, ...]) -> None:
        refuse(self.check_scenario(self.params, scenario, sensors))
        self.sensors = tuple(sensors)
        # under another selection nobody reads them: N·P floats and K·N·P work a round saved
        self.tracks_updates = scenario.selection.name == "bmsfed"

    def aggregate(self, params: dict[str, np.ndarray], batch: UpdateBatch,
                  ctx: AggregationContext) -> dict[str, np.ndarray]:
        out = super().aggregate(params, batch, ctx)
        self._observe_updates(params, batch, ctx.obs.n)
        if MEANS in batch.extras and batch.n:
            means, counts = batch.extras[MEANS], batch.extras[COUNTS]
            if self.protos is None or self.ok is None:
                self.protos = np.zeros(means.shape[1:], np.float32)
                self.ok = np.zeros(counts.shape[1:], bool)
            self.protos, self.ok = merge_prototypes(means, counts, self.protos, self.ok)
            ratio = imbalance_ratio(batch.extras[CORRECT])
            fresh = ~np.isnan(ratio)
            self.ratio[batch.device_ids[fresh]] = ratio[fresh]
        return out

    def _observe_updates(self, params: dict[str, np.ndarray], batch: UpdateBatch,
                         n_devices: int) -> None:
        """Mark the senders known; keep each one's update of every sensor group and refresh
        its distance rows (when selection `bmsfed` reads them: `tracks_updates`)."""
        if self.known.shape[0] != n_devices:
            self.known = np.zeros(n_devices, bool)
            self.ratio = np.full(n_devices, np.nan)
        for m in self.sensors:
            g = f"sensor:{m}"
            if g not in batch.updates:
                continue
            ids = batch.device_ids[batch.senders[g]]
            self.known[ids] = True
            if not self.tracks_updates:
                continue
            if m not in self.vectors:
                self.vectors[m] = np.zeros((n_devices, params[g].shape[0]), np.float32)
                self.dist[m] = np.zeros((n_devices, n_devices), np.float64)
            rows = batch.updates[g]
            # g_i = θ_server − θ_i; an uploaded delta is θ_i − θ_server already
            self.vectors[m][ids] = -rows if self.takes_deltas else params[g][None, :] - rows
            d = distance_rows(self.vectors[m], ids)
            self.dist[m][ids] = d
            self.dist[m][:, ids] = d.T

    def extras(self, round: int) -> dict[str, np.ndarray]:
        if self.protos is None or self.ok is None:
            return {}
        return {PROTO: self.protos, PROTO_OK: self.ok.astype(np.float32)}

    def selection_view(self) -> dict[str, np.ndarray]:
        out = {KNOWN: self.known, RATIO: self.ratio}
        for m in self.sensors:
            if m in self.dist:
                out[DIST + m] = self.dist[m]
        return out

    def extras_uplink_bytes(self, batch: UpdateBatch) -> np.ndarray:
        """Per device: E floats and a count for every (sensor, class) it reported, and a count
        per sensor it trained with."""
        if MEANS not in batch.extras or not batch.n:
            return np.zeros(batch.n, np.int64)
        dim = int(batch.extras[MEANS].shape[-1])
        classes = (batch.extras[COUNTS] > 0).reshape(batch.n, -1).sum(axis=1)
        sensors = (batch.extras[CORRECT] >= 0).sum(axis=1)
        out: npt.NDArray[np.int64] = (classes * (dim + 1) * FLOAT_BYTES
                                      + sensors * FLOAT_BYTES).astype(np.int64)
        return out

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"known": self.known.copy(), "ratio": self.ratio.copy(),
                                 "vectors": {m: v.copy() for m, v in self.vectors.items()},
                                 "dist": {m: v.copy() for m, v in self.dist.items()}}
        if self.protos is not None and self.ok is not None:
            state["protos"], state["ok"] = self.protos.copy(), self.ok.copy()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.known = np.asarray(state["known"], bool).copy()
        self.ratio = np.asarray(state["ratio"], np.float64).copy()
        self.vectors = {m: np.asarray(v, np.float32).copy() for m, v in state["vectors"].items()}
        self.dist = {m: np.asarray(v, np.float64).copy() for m, v in state["dist"].items()}
        if "protos" in state:
            self.protos = np.asarray(state["protos"], np.float32).copy()
            self.ok = np.asarray(state["ok"], bool).copy()


@AGGREGATORS.register("bmsfed_delta")
class BMSFedDelta(BMSFedAggregation):
    """`bmsfed` on uploaded deltas (`training.exchange: delta`, periodic sync): the weighted
    mean change is added to the global vector; an update vector is the negated delta."""

    takes_deltas = True

    def merge(self, current: np.ndarray, mean: np.ndarray) -> np.ndarray:
        merged: npt.NDArray[np.float32] = (current + mean).astype(np.float32)
        return merged
