"""SSCA: sparse sign-guided consensus aggregation with K cluster models per group (FedMChain).

Per group (one modality's encoder + classifier, flattened) at each sync, over the devices
that sent it (their deltas ΔΘ_i against the vector they trained from, weights w_i ∝ n_i):

1. sparsify: keep exactly round(κ·P) coordinates of ΔΘ_i (at least one) by magnitude
   (κ = retention ratio), zero the rest -> ΔΘ̃_i; sign vectors s_i = sign(ΔΘ̃_i);
2. KMeans (scikit-learn, seeded) on the s_i into K' clusters,
   K' = max(1, min(K, ⌊senders / s_min⌋)) (s_min = `min_cluster_size`);
3. cluster consensus ΔΘ̄^k (w-weighted mean of ΔΘ̃_i) and cluster weight α_k = Σ w_i;
4. per coordinate p = Σ positive |ΔΘ̄^k|, n = Σ negative |ΔΘ̄^k|, ρ = max(p, n)/(p + n + ε),
   µ = 1[ρ ≥ π], d = sign(p - n);
5. ΔΘ̂ = Σ_k α_k ΔΘ̄^k 1[sign ΔΘ̄^k = d] / (Σ_k α_k 1[sign ΔΘ̄^k = d] + ε) where µ = 1;
   per cluster ΔΘ̂^k = µ·ΔΘ̂ + (1 - µ)·ΔΘ̄^k;
6. match new clusters to model indices by maximum member overlap with the devices' previous
   indices k_i (Hungarian); each matched model becomes its members' own bases plus the merged
   update, Θ^(k) ← Σ_{i∈C_k} w_i Θ_base,i / α_k + λ_merge·ΔΘ̂^k (coherent bases: a delta is
   only ever added to the vector it was computed against); a model no cluster matched keeps
   its value; the members adopt the matched index.

Rules the paper leaves open, as raymm fixes them (docs/methods/fedmchain.md):
- top-κ keeps exactly round(κ·P) coordinates; among equal magnitudes at the threshold the
  lower coordinate index is kept (so the count never depends on ties);
- K' is also capped by the number of distinct sign vectors (KMeans cannot fill more clusters);
- a device uses its cluster's model once clustered and the consensus before, for training and
  for evaluation alike (so its base is always a vector the server holds); the consensus (the
  group's global vector) is the mean of the K models weighted by the last sync's α per model
  (model 0 before any sync).
`bases: matched` restores the paper's update Θ^(k) ← Θ^(k) + λ_merge·ΔΘ̂^k (a member's
delta is added to the matched model whatever it trained from), for measuring the difference.
Every step is vectorised over the flat vector; Python loops run over clusters, the senders
of a cluster (row-by-row sums, the order numpy's own sum takes) and blocks of columns.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field

from raymm import seeding
from raymm.protocol.messages import ClusterModels, UpdateBatch
from raymm.protocol.registry import AGGREGATORS
from raymm.protocol.seams import AggregationContext, Aggregator

if TYPE_CHECKING:
    from threadpoolctl import ThreadpoolController


class SSCAParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    kappa: float = Field(default=0.7, gt=0, le=1)        # retention ratio of top-κ
    clusters: int = Field(default=5, ge=1)               # K
    #: consistency threshold π, in (0, 1]; 1 never merges across clusters (each cluster
    #: keeps its own consensus everywhere: the "no merging" arm of the clustered study)
    pi: float = Field(default=0.9, gt=0, le=1)
    lambda_merge: float = Field(default=0.9, gt=0, le=1)
    eps: float = Field(default=1e-12, gt=0)
    #: s_min: at most ⌊senders / s_min⌋ clusters, so a cluster holds about s_min devices
    min_cluster_size: int = Field(default=8, ge=1)
    #: coherent: a cluster model is rebuilt from its members' own bases (docs/methods/fedmchain.md);
    #: matched: the matched model plus the merged update (the paper's update)
    bases: Literal["coherent", "matched"] = "coherent"
    #: every_sync: every sender takes the cluster KMeans gives it at each sync (the paper);
    #: once: a sender keeps the model index of its first clustering in the branch, and only
    #: senders never clustered take their KMeans cluster's index (measured on the clustered
    #: benchmark: near convergence the update signs are noise and re-clustering mixes groups)
    reassign: Literal["every_sync", "once"] = "every_sync"


# ------------------------------------------------------------------ the steps, as functions


#: worker threads for the row- and column-parallel passes (numpy releases the GIL); every
#: thread writes its own rows or columns, so no value depends on this number
THREADS = max(1, min(8, len(os.sched_getaffinity(0))))

#: elements per block of a row pass: small enough that a block's temporaries stay in cache
ROW_BLOCK = 1 << 16

#: a row is sampled at about this many points to bracket its threshold; rows shorter than
#: 4 samples are partitioned whole
SAMPLE = 1 << 16


_Item = TypeVar("_Item")


def _parallel(fn: Callable[[_Item], object], items: Sequence[_Item]) -> None:
    """fn(item) for every item, on up to THREADS threads."""
    if THREADS <= 1 or len(items) <= 1:
        for item in items:
            fn(item)
        return
    with ThreadPoolExecutor(min(THREADS, len(items))) as pool:
        for _ in pool.map(fn, items):
            pass


def threshold_bracket(x: np.ndarray, r: int) -> tuple[np.generic, np.generic] | None:
    """Magnitudes (lo, hi) that likely enclose the r-th smallest (0-based) |x| of a 1-d row:
    ranks about 6σ either side of r's place in a strided sample of ~SAMPLE points (so a few
    percent of the row lies between them). None for a row too short to sample."""
    size = x.shape[0]
    if size < 4 * SAMPLE:
        return None
    sample = np.abs(x[::size // SAMPLE])
    m = sample.shape[0]
    q = r / size
    margin = 6.0 * float(np.sqrt(m * q * (1.0 - q))) + 16.0
    lo_k, hi_k = max(0, int(q * m - margin)), min(m - 1, int(q * m + margin))
    sample.partition([lo_k, hi_k])
    return sample[lo_k], sample[hi_k]


def kth_magnitude(x: np.ndarray, r: int) -> np.generic:
    """The r-th smallest (0-based) |x| of a 1-d row, as a full partition of |x| finds it (NaN
    sorts last), as a rule without one: one blocked pass counts the magnitudes below the
    row's `threshold_bracket` and collects those inside it, and only those (a few percent of
    the row) are partitioned. A bracket that misses rank r (an unlucky sample, NaN at its
    ends) or a short row falls back to partitioning the whole row."""
    size = x.shape[0]
    bracket = threshold_bracket(x, r)
    if bracket is not None:
        lo, hi = bracket
        below, inside = 0, []
        a = np.empty(min(ROW_BLOCK, size), x.dtype)
        under, within = np.empty(a.shape, bool), np.empty(a.shape, bool)
        for start in range(0, size, ROW_BLOCK):
            n = min(ROW_BLOCK, size - start)
            np.abs(x[start:start + n], out=a[:n])
            np.less(a[:n], lo, out=under[:n])
            below += int(np.count_nonzero(under[:n]))
            np.less_equal(a[:n], hi, out=within[:n])
            np.greater(within[:n], under[:n], out=within[:n])     # lo <= |x| <= hi
            inside.append(np.compress(within[:n], a[:n]))        # cheaper than a[mask]
        cands = np.concatenate(inside)
        if below <= r < below + cands.shape[0]:
            cands.partition(r - below)
            found: np.generic = cands[r - below]
            return found
    full = np.abs(x)
    full.partition(r)
    kth: np.generic = full[r]
    return kth


def _sparsify_row(x: np.ndarray, out: np.ndarray, keep: int) -> None:
    """out = x with all but its `keep` largest magnitudes zeroed (ties: lowest indices), in
    one blocked pass once the threshold is known; a dropped coordinate is x·0 (-0.0 if x < 0,
    as x·False gives)."""
    size = x.shape[0]
    thr = kth_magnitude(x, size - keep)
    kept = 0
    a = np.empty(min(ROW_BLOCK, size), x.dtype)
    mask = np.empty(a.shape, bool)
    for start in range(0, size, ROW_BLOCK):
        n = min(ROW_BLOCK, size - start)
        np.greater_equal(np.abs(x[start:start + n], out=a[:n]), thr, out=mask[:n])
        kept += int(np.count_nonzero(mask[:n]))
        np.multiply(x[start:start + n], mask[:n], out=out[start:start + n])
    if kept > keep:                                   # ties at the threshold: lowest indices
        mag = np.abs(x)
        tied = np.flatnonzero(mag == thr)
        room = keep - int(np.count_nonzero(mag > thr))
        out[tied[room:]] = x[tied[room:]] * 0


def sparsify(deltas: np.ndarray, kappa: float) -> np.ndarray:
    """Rows of `deltas` [n, P] with all but exactly round(κ·P) (at least 1) coordinates set to
    zero: the largest magnitudes, and among magnitudes equal to the threshold the lowest
    indices (a dropped coordinate is x·0). Rows are spread over THREADS; a row's threshold
    comes from `kth_magnitude` (no full partition as a rule), then one blocked pass writes it;
    the output is the only [n, P] buffer."""
    p = deltas.shape[1]
    keep = min(p, max(1, int(round(kappa * p))))
    if keep == p:
        dense: np.ndarray = deltas.copy()
        return dense
    out = np.empty_like(deltas)
    _parallel(lambda i: _sparsify_row(deltas[i], out[i], keep), range(deltas.shape[0]))
    return out


def cluster_count(senders: int, k: int, min_cluster_size: int) -> int:
    """K' = max(1, min(K, ⌊senders / s_min⌋))."""
    return max(1, min(k, senders // min_cluster_size))


#: columns of sign vectors multiplied at once when forming their Gram matrix (float32 sums of
#: ±1 products stay exact integers below 2^24, so every block is exact, and so is the float64
#: sum of the blocks in any order)
GRAM_BLOCK = 1 << 15


def sign_gram(x: np.ndarray) -> np.ndarray:
    """G = S·Sᵀ [n, n] (float64, exact) of the sign vectors S = sign(x) of the rows of x [n, P]
    (sign vectors themselves, or the sparse deltas: no [n, P] sign array is formed). Column
    blocks are spread over THREADS, each summing its own exact partial G."""
    n, p = x.shape
    starts = range(0, p, GRAM_BLOCK)
    lanes = max(1, min(THREADS, len(starts)))
    partial = np.zeros((lanes, n, n), np.float64)

    def lane(j: int) -> None:
        block = np.empty((n, min(GRAM_BLOCK, p)), np.float32)
        for start in starts[j::lanes]:
            b = block[:, :min(GRAM_BLOCK, p - start)]
            np.sign(x[:, start:start + GRAM_BLOCK], out=b)
            partial[j] += b @ b.T

    _parallel(lane, range(lanes))
    gram: npt.NDArray[np.float64] = partial.sum(axis=0)
    return gram


def gram_embedding(gram: np.ndarray) -> np.ndarray:
    """Points X' [n, n] with X'·X'ᵀ = G: the same pairwise distances as the long vectors behind
    G (X' = X·R for an orthogonal R), so KMeans on X' is KMeans on X."""
    vals, vecs = np.linalg.eigh(gram)
    points: npt.NDArray[np.float64] = vecs * np.sqrt(np.clip(vals, 0.0, None))[None, :]
    return points


def distinct_rows(gram: np.ndarray) -> int:
    """How many different vectors are behind a Gram matrix (exact for sign vectors: squared
    distances are integers)."""
    diag = np.diag(gram)
    same = np.abs(diag[:, None] + diag[None, :] - 2 * gram) < 0.5
    first = same.argmax(axis=1)            # lowest index each row equals
    return int(np.unique(first).shape[0])


@functools.cache
def _threadpools() -> ThreadpoolController:
    """The process's native thread pools (BLAS, OpenMP), found once: `threadpool_limits`
    searches every loaded library anew on each use, slow beside torch's many libraries
    (docs/performance.md, "Smaller mechanisms"). Found after scikit-learn's import, so its
    OpenMP runtime is among them."""
    # deferred, as in `cluster_signs` (importing scikit-learn loads the libraries to find)
    from sklearn.cluster import KMeans  # noqa: F401
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()


def cluster_signs(signs: np.ndarray, k: int, random_state: int) -> np.ndarray:
    """KMeans labels [n] of the sign vectors sign(signs) (sign vectors, or the sparse deltas
    themselves) into min(k, n, #distinct rows) clusters (seeded, one BLAS thread, so the same
    on every machine).

    KMeans depends on the points only through their distances, which the n×n Gram matrix holds
    exactly: the long vectors are read once (a blocked S·Sᵀ), and scikit-learn's KMeans runs on
    an n-dimensional isometric embedding, with its tolerance rescaled for the fewer features
    (scikit-learn scales `tol` by the mean per-feature variance)."""
    # deferred: scikit-learn and scipy load on the first clustering (a second of imports)
    from sklearn.cluster import KMeans

    n, p = signs.shape
    with _threadpools().limit(limits=1):
        gram = sign_gram(signs)
        k_eff = min(k, n, distinct_rows(gram))
        if k_eff <= 1:
            return np.zeros(n, np.int64)
        points = gram_embedding(gram)
        km = KMeans(n_clusters=k_eff, n_init=10, random_state=random_state,
                    tol=1e-4 * points.shape[1] / p)
        labels: npt.NDArray[np.int64] = km.fit_predict(points).astype(np.int64)
        return labels


def weighted_row_sum(table: np.ndarray, rows: np.ndarray, w: np.ndarray, cols: slice,
                     out: np.ndarray, tmp: np.ndarray) -> np.ndarray:
    """out = Σ_j w[j]·table[rows[j], cols] in float64, summed from 0 in the order of `rows`:
    the very operations of `(table[rows, cols].astype(np.float64) * w[:, None]).sum(axis=0)`
    (numpy sums along axis 0 row after row from 0), so the same bits, without gathering the
    rows into a copy. `w` must be float64 (a float32 product would round before the cast)."""
    out.fill(0.0)
    for i, wi in zip(rows, w):
        np.copyto(tmp, table[i, cols])         # the exact cast first: cheaper than a mixed loop
        np.multiply(tmp, wi, out=tmp)
        out += tmp
    return out


def cluster_consensus(sparse: np.ndarray, weights: np.ndarray, labels: np.ndarray
                      ) -> tuple[np.ndarray, np.ndarray]:
    """(ΔΘ̄ [K', P], α [K']) for labels 0..K'-1: w-weighted means of each cluster's rows."""
    w = np.asarray(weights, np.float64)
    k = int(labels.max()) + 1
    cons = np.zeros((k, sparse.shape[1]), np.float64)
    alpha = np.zeros(k, np.float64)
    tmp = np.empty(sparse.shape[1], np.float64)
    cols = slice(0, sparse.shape[1])
    for c in range(k):
        m = np.flatnonzero(labels == c)
        alpha[c] = w[m].sum()
        weighted_row_sum(sparse, m, w[m], cols, cons[c], tmp)
        cons[c] /= alpha[c]
    return cons, alpha


def consistency(cons: np.ndarray, pi: float, eps: float
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ρ, µ, d) per coordinate from the cluster consensuses [K', P]."""
    p = np.clip(cons, 0, None).sum(axis=0)
    n = np.clip(-cons, 0, None).sum(axis=0)
    rho = np.maximum(p, n) / (p + n + eps)
    # π = 1: no merging, also where rounding makes ρ exactly 1
    mu = rho >= pi if pi < 1 else np.zeros(rho.shape, bool)
    return rho, mu, np.sign(p - n)


def merge(cons: np.ndarray, alpha: np.ndarray, mu: np.ndarray, d: np.ndarray, eps: float
          ) -> tuple[np.ndarray, np.ndarray]:
    """(ΔΘ̂ [P], per-cluster ΔΘ̂^k [K', P]): the α-weighted mean of the clusters agreeing with
    d where µ = 1, each cluster's own consensus elsewhere."""
    agree = (np.sign(cons) == d[None, :]).astype(np.float64) * alpha[:, None]
    merged = (agree * cons).sum(axis=0) / (agree.sum(axis=0) + eps)
    merged = np.where(mu, merged, 0.0)
    return merged, np.where(mu[None, :], merged[None, :], cons)


def match_clusters(labels: np.ndarray, previous: np.ndarray, n_models: int) -> np.ndarray:
    """Model index for each new cluster 0..K'-1, maximising the members whose previous index
    it keeps (Hungarian assignment; K' ≤ n_models). A previous index of -1 (a device never
    clustered) counts for no model."""
    # deferred: scipy loads on the first matching of cluster ids
    from scipy.optimize import linear_sum_assignment

    k = int(labels.max()) + 1
    overlap = np.zeros((k, n_models), np.int64)
    seen = previous >= 0
    np.add.at(overlap, (labels[seen], previous[seen]), 1)
    rows, cols = linear_sum_assignment(overlap, maximize=True)
    out = np.empty(k, np.int64)
    out[rows] = cols
    return out


@dataclass(frozen=True)
class SSCAStep:
    models: np.ndarray       # [K, P] float32 after the update
    index: np.ndarray        # [n] model index each sender adopts
    labels: np.ndarray       # [n] KMeans labels
    alpha: np.ndarray        # [K] float64 weight of each model at this sync (0: no members)
    rho: np.ndarray
    mu: np.ndarray


#: columns per chunk of the per-coordinate steps 3-6 (consensus, ρ/µ/d, merge, model update):
#: every one of them works coordinate by coordinate, so chunking bounds their float64
#: temporaries to a few [K', COLUMN_BLOCK] (in cache) without changing a single value; chunks
#: run on THREADS threads, each writing its own columns
COLUMN_BLOCK = 1 << 14


def ssca_step(deltas: np.ndarray, weights: np.ndarray, models: np.ndarray,
              previous: np.ndarray, p: SSCAParams, random_state: int,
              bases: np.ndarray | None = None,
              base_rows: tuple[np.ndarray, np.ndarray] | None = None) -> SSCAStep:
    """One SSCA aggregation of one group: steps 1-6 above.

    `previous[i]` is the model index sender i trained from (used to match clusters). The vector
    sender i's delta was computed against is `bases[i]`, or `table[index[i]]` given
    `base_rows = (table, index)` (no [n, P] copy of the bases), by default
    `models[previous[i]]`."""
    sparse = sparsify(deltas, p.kappa)
    k = cluster_count(deltas.shape[0], p.clusters, p.min_cluster_size)
    labels = cluster_signs(sparse, k, random_state)
    target = match_clusters(labels, previous, models.shape[0])
    if p.reassign == "once" and (previous >= 0).any():
        # returning senders stay on their model: the clusters are the models' member sets
        index = np.where(previous >= 0, previous, target[labels])
        target, labels = np.unique(index, return_inverse=True)
        labels = labels.astype(np.int64)
    if base_rows is None:
        base_rows = ((bases, np.arange(deltas.shape[0])) if bases is not None
                     else (models, np.maximum(previous, 0)))
    table, index = base_rows
    w = np.asarray(weights, np.float64)
    members = [np.flatnonzero(labels == c) for c in range(len(target))]
    alpha = np.array([w[m].sum() for m in members], np.float64)
    new = models.astype(np.float32)
    size = deltas.shape[1]
    rho = np.empty(size, np.float64)
    mu = np.empty(size, bool)

    def columns(start: int) -> None:
        cols = slice(start, min(start + COLUMN_BLOCK, size))
        width = cols.stop - start
        cons = np.empty((len(target), width), np.float64)
        tmp, base = np.empty(width, np.float64), np.empty(width, np.float64)
        for c, m in enumerate(members):
            weighted_row_sum(sparse, m, w[m], cols, cons[c], tmp)
            cons[c] /= alpha[c]
        rho[cols], mu[cols], d = consistency(cons, p.pi, p.eps)
        _, per_cluster = merge(cons, alpha, mu[cols], d, p.eps)
        per_cluster *= p.lambda_merge
        for c, model in enumerate(target):
            if p.bases == "coherent":
                weighted_row_sum(table, index[members[c]], w[members[c]], cols, base, tmp)
                base /= alpha[c]
            else:
                base[:] = models[model, cols]
            base += per_cluster[c]
            new[model, cols] = base

    _parallel(columns, range(0, size, COLUMN_BLOCK))
    model_alpha = np.zeros(models.shape[0], np.float64)
    model_alpha[target] = alpha
    return SSCAStep(new, target[labels], labels, model_alpha, rho, mu)


# ------------------------------------------------------------------ the aggregator


@AGGREGATORS.register("ssca")
class SSCA(Aggregator):
    """Owns K cluster models per group, each device's model index and whether it was ever
    clustered; broadcasts them as `ClusterModels`."""

    Params = SSCAParams
    takes_deltas = True

    def __init__(self, params: SSCAParams) -> None:
        # deferred: imported here, when the run is built, so no round pays for it
        import sklearn.cluster  # noqa: F401  (slow first import: at build time, not in a round)

        self.p = params
        self.models: dict[str, np.ndarray] = {}
        self.assignment: dict[str, np.ndarray] = {}
        self.clustered: dict[str, np.ndarray] = {}
        self.alpha: dict[str, np.ndarray] = {}     # [K] each model's weight at the last sync
        self._stats: dict[str, list[float]] = {}

    def aggregate(self, params: dict[str, np.ndarray], batch: UpdateBatch,
                  ctx: AggregationContext) -> dict[str, np.ndarray]:
        out = dict(params)
        self._stats = {}
        for g, deltas in batch.updates.items():
            if g not in self.models:  # all K models start equal to the global vector
                self.models[g] = np.repeat(params[g][None], self.p.clusters, axis=0)
                self.assignment[g] = np.zeros(ctx.obs.n, np.int64)
                self.clustered[g] = np.zeros(ctx.obs.n, bool)
                self.alpha[g] = np.zeros(self.p.clusters, np.float64)
            ids = batch.device_ids[batch.senders[g]]
            seen = self.clustered[g][ids]
            # what each sender trained from: its cluster's model, or the consensus (the global
            # vector) before it was ever clustered; the latter match no model index (-1)
            previous = np.where(seen, self.assignment[g][ids], -1)
            # base rows: the K models, then the global vector (index K)
            table = np.concatenate([self.models[g], params[g][None, :]])
            base_index = np.where(seen, self.assignment[g][ids], self.p.clusters)
            rs = int(seeding.rng(ctx.seed, ctx.round, seeding.SERVER, f"ssca/{g}")
                     .integers(2**31 - 1))
            step = ssca_step(deltas, batch.group_weights(g), self.models[g], previous, self.p,
                             rs, base_rows=(table, base_index))
            self._record(step, previous)
            self.models[g], self.alpha[g] = step.models, step.alpha
            assignment, clustered = self.assignment[g].copy(), self.clustered[g].copy()
            assignment[ids], clustered[ids] = step.index, True
            self.assignment[g], self.clustered[g] = assignment, clustered
            out[g] = self.consensus(g)
        return out

    def _record(self, step: SSCAStep, previous: np.ndarray) -> None:
        """Per-sync diagnostics: clusters used, senders that trained from one model and now
        adopt another (churn; first-time senders not counted), coordinates merged across
        clusters."""
        seen = previous >= 0
        for key, value in (("clusters", float(step.labels.max() + 1)),
                           ("churn", float(np.mean(step.index[seen] != previous[seen]))
                            if seen.any() else 0.0),
                           ("merged_share", float(np.mean(step.mu)))):
            self._stats.setdefault(key, []).append(value)

    def round_stats(self) -> dict[str, float]:
        """This round's diagnostics (means over the groups aggregated), for rounds.parquet."""
        return {f"ssca/{k}": float(np.mean(v)) for k, v in self._stats.items()}

    def consensus(self, g: str) -> np.ndarray:
        """The mean of the K models weighted by the last sync's α (model 0 before any)."""
        a = self.alpha[g]
        mean: npt.NDArray[np.float32]
        if a.sum() <= 0:
            mean = self.models[g][0].copy()
        else:
            mean = ((self.models[g].astype(np.float64) * (a / a.sum())[:, None]).sum(axis=0)
                    ).astype(np.float32)
        return mean

    def cluster_models(self) -> ClusterModels | None:
        if not self.models:
            return None
        return ClusterModels(dict(self.models), dict(self.assignment), dict(self.clustered))

    def extras(self, round: int) -> dict[str, np.ndarray]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {"models": dict(self.models), "assignment": dict(self.assignment),
                "clustered": dict(self.clustered), "alpha": dict(self.alpha)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.models = {g: np.asarray(v, np.float32) for g, v in state["models"].items()}
        self.assignment = {g: np.asarray(v, np.int64) for g, v in state["assignment"].items()}
        self.clustered = {g: np.asarray(v, bool) for g, v in state["clustered"].items()}
        self.alpha = {g: np.asarray(state.get("alpha", {}).get(
            g, np.zeros(self.p.clusters)), np.float64) for g in self.models}
