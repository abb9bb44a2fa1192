"""M3Fed's server: FedAvg, clustering of the updates by angular affinity into cluster models,
and the consensus projection G merged with inverse-distance weights (Li, Qi, Zhang, Xu,
ACM MM 2024; docs/methods/m3fed.md).

At each sync, over the senders i (sample counts w_i), with θ_i = base_i + Δ_i (base_i the
vector the device trained from: its cluster's model once clustered, else the global one):

1. θ̄ = Σ w_i θ_i / Σ w_i per group: the new global vector (pooled evaluation, devices never
   clustered);
2. u_i = θ_i - θ̄ over every group the device sent, G left out; angular affinity
   A_ij = 1 - arccos(cos(u_i, u_j))/π; spectral clustering of A into K' = min(K, senders)
   clusters (scikit-learn, seeded);
3. the clusters take model indices 0..K-1 by maximal overlap with the members' previous
   indices (Hungarian, as SSCA matches them); model k of every group becomes the w-weighted
   mean of its members' θ_i (a model no cluster matched keeps its value); a device trains
   from and is evaluated with its model once clustered;
4. G ← Σ_i ω_i G_i with ω_i ∝ Σ_{j≠i} 1/(‖G_i - G_j‖_F + ε), in the global vector and in
   every cluster model (one consensus for all).

G is the last E×E numbers of `shared` (raymm.models.network.consensus_projection, E =
model.embed_dim), so the aggregator needs `model.consensus: true`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field

from policies.aggregation.ssca import _threadpools, match_clusters
from raymm import seeding
from raymm.config.schema import Scenario
from raymm.errors import refuse
from raymm.models.network import SHARED
from raymm.protocol.messages import ClusterModels, UpdateBatch
from raymm.protocol.registry import AGGREGATORS
from raymm.protocol.seams import AggregationContext, Aggregator


class M3FedAggParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    #: K, the number of cluster models (4 in the released code)
    clusters: int = Field(default=4, ge=1)
    #: ε in the inverse-distance weights of G (the released code's 1e-10)
    eps: float = Field(default=1e-10, gt=0)


# ------------------------------------------------------------------ the steps, as functions


def angular_affinity(gram: np.ndarray) -> np.ndarray:
    """A_ij = 1 - arccos(cos_ij)/π from the Gram matrix of the update vectors (a zero vector
    has cosine 0 with every other: affinity 1/2)."""
    norms = np.sqrt(np.clip(np.diag(gram), 0.0, None))
    denom = norms[:, None] * norms[None, :]
    cos = np.divide(gram, denom, out=np.zeros_like(gram), where=denom > 0)
    np.fill_diagonal(cos, 1.0)
    affinity: npt.NDArray[np.float64] = 1.0 - np.arccos(np.clip(cos, -1.0, 1.0)) / np.pi
    return affinity


def spectral_labels(affinity: np.ndarray, k: int, random_state: int) -> np.ndarray:
    """Labels 0..K'-1 of spectral clustering on a precomputed affinity, K' = min(k, n): one
    cluster for k = 1, every sender its own when there are no more senders than clusters."""
    n = affinity.shape[0]
    k_eff = min(k, n)
    if k_eff <= 1:
        return np.zeros(n, np.int64)
    if k_eff == n:
        return np.arange(n, dtype=np.int64)
    # deferred: scikit-learn loads when the aggregator is built (`M3FedAggregator.__init__`)
    from sklearn.cluster import SpectralClustering

    with _threadpools().limit(limits=1):   # one BLAS thread: the same labels everywhere
        sc = SpectralClustering(n_clusters=k_eff, affinity="precomputed",
                                random_state=random_state)
        raw = sc.fit_predict(affinity)
    # relabel by first appearance: label ids carry no meaning, the match to models does
    _, first, inverse = np.unique(raw, return_index=True, return_inverse=True)
    order = np.argsort(np.argsort(first))
    labels: npt.NDArray[np.int64] = order[inverse].astype(np.int64)
    return labels


def inverse_distance_weights(rows: np.ndarray, eps: float) -> np.ndarray:
    """ω_i ∝ Σ_{j≠i} 1/(‖x_i - x_j‖ + ε), normalised (one row: weight 1)."""
    x = rows.astype(np.float64)
    n = x.shape[0]
    if n == 1:
        return np.ones(1)
    dist = np.stack([np.linalg.norm(x - x[i], axis=1) for i in range(n)])
    inv = 1.0 / (dist + eps)
    np.fill_diagonal(inv, 0.0)
    w: npt.NDArray[np.float64] = inv.sum(axis=1)
    out: npt.NDArray[np.float64] = w / w.sum()
    return out


def weighted_mean(rows: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Σ w_i x_i / Σ w_i in float64, summed over rows in order (not a BLAS product)."""
    mean: npt.NDArray[np.float64] = (rows.astype(np.float64) * w[:, None]).sum(axis=0) / w.sum()
    return mean


# ------------------------------------------------------------------ the aggregator


@AGGREGATORS.register("m3fed")
class M3FedAggregator(Aggregator):
    """Owns K cluster models per group and each device's model index (one for all groups);
    broadcasts them as `ClusterModels`."""

    Params = M3FedAggParams
    takes_deltas = True
    # not `combinable`: the clustering reads every sender's own row

    def __init__(self, params: M3FedAggParams) -> None:
        # sklearn's first import takes seconds: paid once, when the aggregator is built
        import sklearn.cluster  # noqa: F401  (deferred: not by every module importing policies)

        self.p = params
        self.g_size = 0                        # E×E, set by `bind`
        self.models: dict[str, np.ndarray] = {}
        self.assignment = np.zeros(0, np.int64)
        self.clustered = np.zeros(0, bool)
        self.used = 0                          # clusters of the last sync

    @staticmethod
    def check_scenario(params: BaseModel, scenario: Scenario, sensors: tuple[str, ...] | None
                       ) -> list[str]:
        m = scenario.model
        problems = []
        if m.factory != "multimodal" or not m.consensus:
            problems.append("aggregation.name: m3fed merges the consensus projection G of "
                            "raymm's network: set model.consensus: true (factory multimodal)")
        if m.encoder == "identity" or "identity" in m.encoders.values():
            problems.append("aggregation.name: m3fed's G maps every sensor's embedding of one "
                            "width (model.embed_dim): identity encoders have their input's")
        return problems

    def bind(self, scenario: Scenario, sensors: tuple[str, ...]) -> None:
        problems = self.check_scenario(self.p, scenario, sensors)
        if problems:
            refuse(problems)
        self.g_size = scenario.model.embed_dim ** 2

    def aggregate(self, params: dict[str, np.ndarray], batch: UpdateBatch,
                  ctx: AggregationContext) -> dict[str, np.ndarray]:
        out = dict(params)
        if not batch.updates:
            return out
        k = self.p.clusters
        if self.assignment.shape[0] != ctx.obs.n:
            self.assignment = np.zeros(ctx.obs.n, np.int64)
            self.clustered = np.zeros(ctx.obs.n, bool)
        ids = batch.device_ids
        n = ids.shape[0]
        thetas, means = {}, {}
        gram = np.zeros((n, n), np.float64)
        for g, deltas in batch.updates.items():
            if g not in self.models:   # all K models start as the global vector
                self.models[g] = np.repeat(params[g][None], k, axis=0)
            rows = batch.senders[g]
            who = ids[rows]
            base = np.where(self.clustered[who][:, None],
                            self.models[g][self.assignment[who]], params[g][None, :])
            theta = base.astype(np.float64) + deltas
            mean = weighted_mean(theta, batch.group_weights(g))
            u = theta - mean
            if g == SHARED:
                u = u[:, :u.shape[1] - self.g_size]   # G is merged on its own (step 4)
            with _threadpools().limit(limits=1):   # one BLAS thread: the same sums everywhere
                gram[np.ix_(rows, rows)] += u @ u.T
            thetas[g], means[g] = theta, mean
        rs = int(seeding.rng(ctx.seed, ctx.round, seeding.SERVER, "m3fed").integers(2**31 - 1))
        labels = spectral_labels(angular_affinity(gram), k, rs)
        previous = np.where(self.clustered[ids], self.assignment[ids], -1)
        target = match_clusters(labels, previous, k)
        index = target[labels]
        for g, theta in thetas.items():
            rows = batch.senders[g]
            w, mine = batch.group_weights(g), index[rows]
            models = self.models[g].copy()
            for c in np.unique(mine):
                members = mine == c
                models[c] = weighted_mean(theta[members], w[members]).astype(np.float32)
            new = means[g].astype(np.float32)
            if g == SHARED:
                cut = new.shape[0] - self.g_size
                omega = inverse_distance_weights(theta[:, cut:], self.p.eps)
                new[cut:] = weighted_mean(theta[:, cut:], omega).astype(np.float32)
                models[:, cut:] = new[cut:]
            self.models[g], out[g] = models, new
        assignment, clustered = self.assignment.copy(), self.clustered.copy()
        assignment[ids], clustered[ids] = index, True
        self.assignment, self.clustered = assignment, clustered
        self.used = int(labels.max()) + 1
        return out

    def round_stats(self) -> dict[str, float]:
        """The clusters of this sync, for rounds.parquet."""
        return {"m3fed/clusters": float(self.used)}

    def cluster_models(self) -> ClusterModels | None:
        if not self.models:
            return None
        return ClusterModels(dict(self.models), {g: self.assignment for g in self.models},
                             {g: self.clustered for g in self.models})

    def state_dict(self) -> dict[str, Any]:
        return {"models": dict(self.models), "assignment": self.assignment,
                "clustered": self.clustered}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.models = {g: np.asarray(v, np.float32) for g, v in state["models"].items()}
        self.assignment = np.asarray(state["assignment"], np.int64)
        self.clustered = np.asarray(state["clustered"], bool)
