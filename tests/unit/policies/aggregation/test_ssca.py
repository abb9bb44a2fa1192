"""SSCA (policies.aggregation.ssca), step by step, on small hand-made inputs with hand-computed
outputs; the fast paths against plain references; and what the clustered study reads: π = 1
merges nothing across clusters, senders keep their model, a short clustered run."""

from __future__ import annotations

import numpy as np
import pytest

from policies.aggregation.ssca import (
    SSCA,
    SSCAParams,
    cluster_consensus,
    cluster_count,
    cluster_signs,
    consistency,
    distinct_rows,
    gram_embedding,
    match_clusters,
    merge,
    sign_gram,
    sparsify,
    ssca_step,
)
from raymm.protocol.messages import UpdateBatch
from raymm.protocol.observations import Observations
from raymm.protocol.seams import AggregationContext

from helpers import REPO


def test_sparsify_keeps_top_kappa_by_magnitude() -> None:
    d = np.array([[4.0, -2.0, 2.0, -1.0, -3.0, -4.0],
                  [0.1, 0.5, -0.2, 0.0, 0.0, 0.3]])
    # κ = 0.5 of 6 coordinates -> the 3 largest |.| per row
    out = sparsify(d, 0.5)
    np.testing.assert_array_equal(out, [[4, 0, 0, 0, -3, -4], [0, 0.5, -0.2, 0, 0, 0.3]])
    np.testing.assert_array_equal(np.sign(out), [[1, 0, 0, 0, -1, -1], [0, 1, -1, 0, 0, 1]])
    # round(0.3 · 4) = 1 kept
    np.testing.assert_array_equal(sparsify(np.array([[1.0, -3.0, 1.0, 0.5]]), 0.3),
                                  [[0, -3, 0, 0]])
    # round(0.5 · 4) = 2 kept: -3, then of the tied 1s the lower index
    np.testing.assert_array_equal(sparsify(np.array([[1.0, -3.0, 1.0, 0.5]]), 0.5),
                                  [[1, -3, 0, 0]])
    # all equal: exactly the first round(0.6 · 5) = 3
    np.testing.assert_array_equal(sparsify(np.array([[2.0, -2.0, 2.0, 2.0, -2.0]]), 0.6),
                                  [[2, -2, 2, 0, 0]])
    assert np.array_equal(sparsify(d, 1.0), d)


def test_cluster_signs_groups_directions_and_caps_k() -> None:
    s = np.array([[1, 1, -1, -1, 1], [1, 1, -1, 0, 1], [-1, -1, 1, 1, -1],
                  [-1, -1, 1, 1, -1]], dtype=float)
    lab = cluster_signs(s, 2, random_state=0)
    assert lab[0] == lab[1] and lab[2] == lab[3] and lab[0] != lab[2]
    # K = 5 but only 3 distinct sign vectors among 4 devices -> 3 clusters
    lab5 = cluster_signs(s, 5, random_state=0)
    assert len(set(lab5.tolist())) == 3 and lab5[2] == lab5[3]
    assert np.array_equal(cluster_signs(s, 1, 0), np.zeros(4, np.int64))
    assert np.array_equal(lab, cluster_signs(s, 2, random_state=0))  # seeded


def test_cluster_consensus_weighted_means_and_alpha() -> None:
    sparse = np.array([[2.0, 0.0, 4.0], [0.0, -2.0, 1.0], [1.0, 1.0, 1.0]])
    w = np.array([1.0, 3.0, 2.0])
    cons, alpha = cluster_consensus(sparse, w, np.array([0, 0, 1]))
    # cluster 0: (1·[2,0,4] + 3·[0,-2,1]) / 4 = [0.5, -1.5, 1.75]
    np.testing.assert_allclose(cons, [[0.5, -1.5, 1.75], [1.0, 1.0, 1.0]])
    np.testing.assert_allclose(alpha, [4.0, 2.0])


def test_consistency_rho_mask_and_direction() -> None:
    cons = np.array([[2.0, -1.0, 1.0, 0.0], [1.0, 1.0, -3.0, 0.0]])
    rho, mu, d = consistency(cons, pi=0.7, eps=1e-12)
    # p = [3, 1, 1, 0], n = [0, 1, 3, 0]
    np.testing.assert_allclose(rho, [1.0, 0.5, 0.75, 0.0])
    np.testing.assert_array_equal(mu, [True, False, True, False])
    np.testing.assert_array_equal(d, [1, 0, -1, 0])


def test_merge_dominant_direction_and_per_cluster_update() -> None:
    cons = np.array([[2.0, -1.0, 1.0, 0.0], [1.0, 1.0, -3.0, 0.0]])
    alpha = np.array([1.0, 3.0])
    mu = np.array([True, False, True, False])
    d = np.array([1.0, 0.0, -1.0, 0.0])
    merged, per = merge(cons, alpha, mu, d, eps=1e-12)
    # q0: both agree with d=+1: (1·2 + 3·1)/4 = 1.25; q2: only cluster 1 agrees: -3
    np.testing.assert_allclose(merged, [1.25, 0.0, -3.0, 0.0])
    np.testing.assert_allclose(per, [[1.25, -1.0, -3.0, 0.0], [1.25, 1.0, -3.0, 0.0]])


def test_match_clusters_maximum_overlap() -> None:
    labels = np.array([0, 0, 1, 1, 1])
    previous = np.array([2, 2, 0, 0, 1])
    # cluster 0 keeps model 2 (2 members), cluster 1 keeps model 0 (2 of its 3 members)
    np.testing.assert_array_equal(match_clusters(labels, previous, 3), [2, 0])
    # a conflict: both clusters mostly came from model 0; the larger overlap wins it
    np.testing.assert_array_equal(match_clusters(np.array([0, 0, 0, 1, 1, 1]),
                                                 np.array([0, 0, 0, 0, 0, 1]), 2), [0, 1])


def test_cluster_count_follows_the_minimum_cluster_size() -> None:
    # K' = max(1, min(K, ⌊senders / s_min⌋))
    assert cluster_count(15, 5, 8) == 1      # 15 senders: one cluster, not five of three
    assert cluster_count(49, 5, 8) == 5      # the paper's scale: K
    assert cluster_count(16, 5, 8) == 2
    assert cluster_count(3, 5, 8) == 1
    assert cluster_count(15, 5, 1) == 5      # s_min = 1: the unrevised min(K, senders)


def _step_inputs() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    deltas = np.array([[1.0, 2.0, -1.0, 0.1], [1.0, 2.0, -1.0, 0.1],
                       [-1.0, -2.0, -1.0, 0.1]], np.float32)
    w = np.array([1.0, 1.0, 2.0])
    models = np.zeros((3, 4), np.float32)
    models[2] = 10.0
    return deltas, w, models


def test_ssca_step_updates_matched_models_only() -> None:
    deltas, w, models = _step_inputs()
    p = SSCAParams(kappa=0.75, clusters=3, pi=0.9, lambda_merge=0.5, min_cluster_size=1)
    step = ssca_step(deltas, w, models, np.array([1, 1, 0]), p, random_state=0)
    # sparse: round(0.75·4) = 3 kept -> the 0.1 entries drop; clusters {0,1} and {2}
    assert step.labels[0] == step.labels[1] != step.labels[2]
    # cons A = [1, 2, -1, 0] (α 2), cons B = [-1, -2, -1, 0] (α 2): ρ = [.5, .5, 1, 0]
    np.testing.assert_allclose(step.rho, [0.5, 0.5, 1.0, 0.0], atol=1e-9)
    # q2 merges to -1 in both; q0, q1 keep their own clusters'; members keep models 1 and 0
    np.testing.assert_array_equal(step.index, [1, 1, 0])
    np.testing.assert_allclose(step.models[1], 0.5 * np.array([1, 2, -1, 0]))
    np.testing.assert_allclose(step.models[0], 0.5 * np.array([-1, -2, -1, 0]))
    np.testing.assert_allclose(step.models[2], 10.0)  # no cluster matched it
    np.testing.assert_allclose(step.alpha, [2.0, 2.0, 0.0])


def test_a_mixed_base_cluster_is_rebuilt_from_its_members_own_bases() -> None:
    # devices 0 and 1 share a sign pattern (one cluster) but trained from models 2 and 1
    deltas, w, models = _step_inputs()
    models[1] = 4.0
    p = SSCAParams(kappa=0.75, clusters=3, pi=0.9, lambda_merge=0.5, min_cluster_size=1)
    step = ssca_step(deltas, w, models, np.array([2, 1, 0]), p, random_state=0)
    # the cluster of 0 and 1 ties on overlap (one member each from 2 and 1); Hungarian gives
    # it one of them. Whichever it is, its new value is the members' mean base
    # (1·10 + 1·4)/2 = 7, plus 0.5·[1, 2, -1, 0]; never 10 or 4 plus the update
    k = int(step.index[0])
    assert k in (1, 2) and step.index[1] == k
    np.testing.assert_allclose(step.models[k], 7.0 + 0.5 * np.array([1, 2, -1, 0]))
    np.testing.assert_allclose(step.models[0], 0.5 * np.array([-1, -2, -1, 0]))
    other = 3 - k
    np.testing.assert_allclose(step.models[other], models[other])  # unmatched: unchanged
    # the pre-revision rule adds the update to the matched model whatever its members had
    old = ssca_step(deltas, w, models, np.array([2, 1, 0]),
                    p.model_copy(update={"bases": "matched"}), random_state=0)
    np.testing.assert_allclose(old.models[k], models[k] + 0.5 * np.array([1, 2, -1, 0]))


def test_one_cluster_with_bases_is_the_weighted_mean_of_bases_plus_update() -> None:
    # 15 senders, s_min 8: K' = 1, so SSCA is the weighted mean delta merged onto the
    # weighted mean base; with κ = 1 and one cluster every nonzero coordinate merges (ρ = 1)
    rng = np.random.default_rng(3)
    deltas = rng.standard_normal((15, 6)).astype(np.float32)
    w = rng.integers(1, 9, 15).astype(np.float64)
    models = rng.standard_normal((5, 6)).astype(np.float32)
    prev = rng.integers(0, 5, 15)
    p = SSCAParams(kappa=1.0, clusters=5, lambda_merge=0.9)
    step = ssca_step(deltas, w, models, prev, p, random_state=0)
    assert set(step.labels.tolist()) == {0}
    base = (models[prev].astype(np.float64) * w[:, None]).sum(0) / w.sum()
    delta = (deltas.astype(np.float64) * w[:, None]).sum(0) / w.sum()
    k = int(step.index[0])
    np.testing.assert_allclose(step.models[k], base + 0.9 * delta, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("bases", ["coherent", "matched"])
def test_column_chunks_and_base_rows_change_no_value(monkeypatch, bases) -> None:
    """Steps 3-6 run over column chunks, and the aggregator passes bases as rows of a table:
    both bound memory at ResNet size and must give exactly the one-pass, explicit-bases step."""
    import policies.aggregation.ssca as ssca

    rng = np.random.default_rng(5)
    n, P, K = 12, 1000, 4
    deltas = (rng.standard_normal((n, P)) * rng.uniform(0.5, 2, (n, 1))).astype(np.float32)
    deltas[:6] += rng.standard_normal(P).astype(np.float32)
    w = rng.integers(1, 50, n).astype(np.float64)
    models = rng.standard_normal((K, P)).astype(np.float32)
    prev = rng.integers(-1, K, n)
    glob = rng.standard_normal(P).astype(np.float32)
    explicit = np.where((prev >= 0)[:, None], models[np.maximum(prev, 0)], glob[None])
    p = SSCAParams(clusters=K, min_cluster_size=2, bases=bases)
    one_pass = ssca_step(deltas, w, models, prev, p, 0, bases=explicit)
    monkeypatch.setattr(ssca, "COLUMN_BLOCK", 96)
    table = np.concatenate([models, glob[None]])
    chunked = ssca_step(deltas, w, models, prev, p, 0,
                        base_rows=(table, np.where(prev >= 0, prev, K)))
    for field in ("models", "index", "labels", "alpha", "rho", "mu"):
        assert np.array_equal(getattr(one_pass, field), getattr(chunked, field)), field
    assert chunked.models.dtype == np.float32 and len(set(one_pass.labels.tolist())) > 1


def _batch(ids: list[int], samples: list[int], rows: list[list[float]]) -> UpdateBatch:
    n = len(ids)
    return UpdateBatch(
        device_ids=np.array(ids), num_samples=np.array(samples),
        compute_seconds=np.zeros(n), loss=np.zeros(n),
        updates={"sensor:a": np.array(rows, np.float32)},
        senders={"sensor:a": np.arange(n)}, extras={}, failed=np.zeros(0, np.int64), errors=())


def test_aggregator_bases_assignment_and_alpha_weighted_consensus() -> None:
    agg = SSCA(SSCAParams(kappa=1.0, clusters=2, pi=0.9, lambda_merge=1.0, min_cluster_size=1))
    assert agg.cluster_models() is None
    obs = Observations.register(np.ones((4, 1), bool), np.zeros(4, np.int64))
    obs.observe_online(np.arange(4), np.array([1, 1, 2, 5]))
    params = {"sensor:a": np.array([5.0, 5.0], np.float32)}
    # sync 1: nobody clustered yet, so every base is the global vector [5, 5]
    out = agg.aggregate(params, _batch([0, 1, 2], [1, 1, 2], [[1, 1], [1, 1], [-1, -1]]),
                        AggregationContext(1, ("a",), obs, seed=0))
    cm = agg.cluster_models()
    assert cm is not None
    a, b = cm.assignment["sensor:a"][[0, 2]]
    assert a != b and cm.assignment["sensor:a"][1] == a
    np.testing.assert_array_equal(cm.clustered["sensor:a"], [True, True, True, False])
    # ρ = 0.5 < π everywhere: each cluster keeps its own consensus
    np.testing.assert_allclose(cm.params["sensor:a"][a], [6, 6])
    np.testing.assert_allclose(cm.params["sensor:a"][b], [4, 4])
    # consensus weighted by this sync's α per model: (2·6 + 2·4)/4
    np.testing.assert_allclose(out["sensor:a"], [5.0, 5.0])
    assert params["sensor:a"][0] == 5.0  # input not mutated
    assert agg.round_stats()["ssca/clusters"] == 2.0

    # sync 2: device 0 trained from model a = [6, 6] (weight 1), device 3 (never clustered)
    # from the consensus [5, 5] (weight 5); same direction -> one cluster, matched to a
    out = agg.aggregate(out, _batch([0, 3], [1, 5], [[1, 1], [1, 1]]),
                        AggregationContext(2, ("a",), obs, seed=0))
    cm = agg.cluster_models()
    assert cm is not None
    assert cm.assignment["sensor:a"][3] == a and cm.clustered["sensor:a"][3]
    # members' bases (1·6 + 5·5)/6 plus the merged update 1; model b keeps [4, 4]
    np.testing.assert_allclose(cm.params["sensor:a"][a], [31 / 6 + 1] * 2, rtol=1e-6)
    np.testing.assert_allclose(cm.params["sensor:a"][b], [4, 4])
    # only model a had members at the last sync
    np.testing.assert_allclose(out["sensor:a"], [31 / 6 + 1] * 2, rtol=1e-6)
    assert agg.round_stats()["ssca/churn"] == 0.0
    state = agg.state_dict()
    again = SSCA(agg.p)
    again.load_state_dict(state)
    np.testing.assert_array_equal(again.consensus("sensor:a"), out["sensor:a"])


def test_churn_never_adds_a_delta_to_a_model_it_was_not_computed_against() -> None:
    # a long random run of syncs with churning clusters: every updated model equals the
    # weighted mean of its members' bases plus λ·(its merged update), never another model
    rng = np.random.default_rng(7)
    agg = SSCA(SSCAParams(kappa=0.7, clusters=3, pi=0.9, lambda_merge=0.9, min_cluster_size=2))
    n = 12
    obs = Observations.register(np.ones((n, 1), bool), np.zeros(n, np.int64))
    obs.observe_online(np.arange(n), np.full(n, 10))
    params = {"sensor:a": rng.standard_normal(8).astype(np.float32)}
    for t in range(1, 9):
        ids = np.sort(rng.choice(n, 8, replace=False))
        cm = agg.cluster_models()
        bases = np.stack([cm.params["sensor:a"][cm.assignment["sensor:a"][i]]
                          if cm is not None and cm.clustered["sensor:a"][i]
                          else params["sensor:a"] for i in ids]).astype(np.float64)
        deltas = rng.standard_normal((8, 8)).astype(np.float32)
        params = agg.aggregate(params, _batch(ids.tolist(), [10] * 8, deltas.tolist()),
                               AggregationContext(t, ("a",), obs, seed=0))
        new = agg.cluster_models()
        assert new is not None
        idx = new.assignment["sensor:a"][ids]
        for k in np.unique(idx):
            members = idx == k
            # what SSCA added to the members' mean base is bounded by the sparse deltas:
            # model - mean base equals λ·ΔΘ̂^k, whose every coordinate lies between the
            # members' smallest and largest sparse delta (a convex combination)
            diff = new.params["sensor:a"][k] - bases[members].mean(axis=0)
            sparse = sparsify(deltas, 0.7).astype(np.float64)
            lo = 0.9 * np.minimum(sparse.min(axis=0), 0) - 1e-5
            hi = 0.9 * np.maximum(sparse.max(axis=0), 0) + 1e-5
            assert np.all(diff >= lo) and np.all(diff <= hi)


@pytest.mark.parametrize("kappa", [0.1, 0.5, 0.73, 1.0])
def test_sparsify_keeps_exactly_round_kappa(kappa: float) -> None:
    d = np.random.default_rng(0).standard_normal((5, 37))
    d[:, :10] = 1.0  # many ties
    kept = (sparsify(d, kappa) != 0).sum(axis=1)
    assert (kept == max(1, round(kappa * 37))).all()


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_gram_clustering_gives_the_labels_of_kmeans_on_the_long_vectors(seed: int) -> None:
    """Unambiguous clusters (5 sign prototypes, 8% of coordinates flipped or zeroed per
    device): the n×n Gram route labels every device exactly as scikit-learn's KMeans on the
    full [n, P] sign vectors does with the same seed."""
    from sklearn.cluster import KMeans

    rng = np.random.default_rng(seed)
    protos = rng.choice([-1.0, 1.0], size=(5, 3000))
    members = rng.integers(0, 5, 40)
    signs = protos[members].copy()
    noise = rng.random(signs.shape) < 0.08
    signs[noise] = rng.choice([-1.0, 0.0, 1.0], size=int(noise.sum()))
    ours = cluster_signs(signs, 5, random_state=seed)
    reference = KMeans(n_clusters=5, n_init=10, random_state=seed).fit_predict(signs)
    np.testing.assert_array_equal(ours, reference)


def test_gram_helpers_are_exact() -> None:
    s = np.array([[1, -1, 0, 1], [1, -1, 0, 1], [-1, 0, 1, 1]], np.float32)
    g = sign_gram(s)
    np.testing.assert_array_equal(g, s.astype(np.float64) @ s.T.astype(np.float64))
    assert distinct_rows(g) == 2
    x = gram_embedding(g)
    np.testing.assert_allclose(x @ x.T, g, atol=1e-9)


# ------------------------------------------------- the fast paths against plain references


def _reference_sparsify(d: np.ndarray, kappa: float) -> np.ndarray:
    """Top-κ by a stable sort: largest magnitudes first, lower index first among equals."""
    p = d.shape[1]
    keep = min(p, max(1, round(kappa * p)))
    order = np.argsort(-np.abs(d), axis=1, kind="stable")[:, :keep]
    mask = np.zeros(d.shape, bool)
    np.put_along_axis(mask, order, True, axis=1)
    return d * mask


def _rows_with_ties(rng: np.random.Generator, n: int, p: int) -> np.ndarray:
    d = rng.standard_normal((n, p)).astype(np.float32)
    d[1] = rng.integers(-3, 4, p) * 0.5                  # seven magnitudes: ties everywhere
    d[2, rng.random(p) < 0.6] = -0.25                    # the threshold is a tied value
    d[3] = 0.0                                           # all zero (and -0.0 below)
    d[4, ::2] = -0.0
    d[5, ::(p // 16)] = 100.0                            # the strided sample sees only these
    return d


@pytest.mark.parametrize("kappa", [0.7, 0.3, 0.01, 0.999])
def test_sparsify_is_the_stable_sort_reference_bit_for_bit(monkeypatch, kappa: float) -> None:
    """The sampled-bracket threshold (SAMPLE made small so these rows take it), the fallback
    to a full partition and the row threads give exactly the reference's array, including
    which zeros are -0.0."""
    import policies.aggregation.ssca as ssca

    monkeypatch.setattr(ssca, "SAMPLE", 16)
    monkeypatch.setattr(ssca, "ROW_BLOCK", 100)
    rng = np.random.default_rng(11)
    d = _rows_with_ties(rng, 8, 1000)
    keep = max(1, round(kappa * 1000))
    if kappa in (0.3, 0.7):   # both routes run: row 0's bracket holds the rank, row 5's misses
        r = 1000 - keep
        for row, holds in ((0, True), (5, False)):
            bracket = ssca.threshold_bracket(d[row], r)
            assert bracket is not None
            below = np.sum(np.abs(d[row]) < bracket[0])
            assert (below <= r < np.sum(np.abs(d[row]) <= bracket[1])) == holds
    for threads in (1, 3):
        monkeypatch.setattr(ssca, "THREADS", threads)
        for rows in (d, d.astype(np.float64)):
            ref = _reference_sparsify(rows, kappa)
            out = sparsify(rows, kappa)
            assert out.dtype == rows.dtype
            np.testing.assert_array_equal(out.view(np.uint8), ref.view(np.uint8))


def test_sparsify_leaves_nan_where_the_full_partition_does() -> None:
    d = np.random.default_rng(2).standard_normal((2, 300_000)).astype(np.float32)
    d[0, ::7] = np.nan                                   # NaN sorts last: never kept, stays NaN
    out = sparsify(d, 0.7)
    full = np.abs(d)
    thr = np.partition(full, 90_000, axis=1)[:, 90_000:90_001]
    np.testing.assert_array_equal(out, d * (full >= thr))


def _reference_step(deltas: np.ndarray, w: np.ndarray, models: np.ndarray, prev: np.ndarray,
                    p: SSCAParams, rs: int, bases: np.ndarray) -> tuple[np.ndarray, ...]:
    """Steps 1-6 in one pass over all columns, written plainly (fancy-indexed copies,
    float64 sums along axis 0, as the module did before it was chunked and threaded)."""
    sparse = _reference_sparsify(deltas, p.kappa)
    k = cluster_count(deltas.shape[0], p.clusters, p.min_cluster_size)
    labels = cluster_signs(np.sign(sparse), k, rs)
    target = match_clusters(labels, prev, models.shape[0])
    cons = np.stack([(sparse[labels == c].astype(np.float64) * w[labels == c, None]).sum(0)
                     / w[labels == c].sum() for c in range(len(target))])
    alpha = np.array([w[labels == c].sum() for c in range(len(target))])
    rho, mu, d = consistency(cons, p.pi, p.eps)
    _, per = merge(cons, alpha, mu, d, p.eps)
    new = models.copy()
    for c, m in enumerate(target):
        base = ((bases[labels == c].astype(np.float64) * w[labels == c, None]).sum(0)
                / alpha[c]) if p.bases == "coherent" else models[m].astype(np.float64)
        new[m] = base + p.lambda_merge * per[c]
    return new, labels, rho, mu


@pytest.mark.parametrize("bases", ["coherent", "matched"])
def test_ssca_step_is_the_plain_reference_bit_for_bit(monkeypatch, bases) -> None:
    """Threads, column chunks, Gram blocks and the row-by-row weighted sums change no bit."""
    import policies.aggregation.ssca as ssca

    rng = np.random.default_rng(9)
    n, P, K = 30, 3000, 5
    protos = rng.standard_normal((K, P)).astype(np.float32)
    deltas = protos[rng.integers(0, K, n)] + rng.standard_normal((n, P)).astype(np.float32)
    deltas[:3] = _rows_with_ties(rng, 6, P)[1:4]
    w = rng.integers(1, 100, n) * 1.37
    models = rng.standard_normal((K, P)).astype(np.float32)
    prev = rng.integers(0, K, n)
    p = SSCAParams(clusters=K, min_cluster_size=4, bases=bases)
    new, labels, rho, mu = _reference_step(deltas, w, models, prev, p, 4, models[prev])
    assert len(set(labels.tolist())) > 2
    monkeypatch.setattr(ssca, "SAMPLE", 64)
    monkeypatch.setattr(ssca, "GRAM_BLOCK", 700)
    for threads, block in ((1, 1 << 14), (3, 128)):
        monkeypatch.setattr(ssca, "THREADS", threads)
        monkeypatch.setattr(ssca, "COLUMN_BLOCK", block)
        step = ssca_step(deltas, w, models, prev, p, 4)
        np.testing.assert_array_equal(step.labels, labels)
        for ours, ref in ((step.models, new), (step.rho, rho), (step.mu, mu)):
            np.testing.assert_array_equal(ours.view(np.uint8), ref.view(np.uint8))


def test_sign_gram_of_values_in_blocks_and_threads_is_exact(monkeypatch) -> None:
    import policies.aggregation.ssca as ssca

    x = np.random.default_rng(4).standard_normal((7, 1001))
    x[:, ::3] = 0.0
    s = np.sign(x)
    for threads, block in ((1, 1 << 15), (3, 100)):
        monkeypatch.setattr(ssca, "THREADS", threads)
        monkeypatch.setattr(ssca, "GRAM_BLOCK", block)
        np.testing.assert_array_equal(sign_gram(x), s @ s.T)


# ------------------------------------------------------------------ the clustered benchmark
def test_pi_one_merges_nothing():
    cons = np.array([[1.0, 2e6, -1.0], [1.0, 3e6, 1.0]])
    _, mu, _ = consistency(cons, 1.0, 1e-12)
    assert not mu.any()
    _, mu, _ = consistency(cons, 0.9, 1e-12)
    assert mu.tolist() == [True, True, False]


def test_reassign_once_keeps_returning_senders_on_their_model():
    from policies.aggregation.ssca import SSCAParams, ssca_step

    rng = np.random.default_rng(1)
    direction = rng.standard_normal((2, 50))
    deltas = np.concatenate([direction[0] + 0.1 * rng.standard_normal((4, 50)),
                             direction[1] + 0.1 * rng.standard_normal((4, 50))])
    models = np.zeros((2, 50), np.float32)
    previous = np.array([1, 1, 0, -1, 0, 0, 1, -1])          # some returning on the "wrong" model
    p = SSCAParams(clusters=2, min_cluster_size=1, reassign="once")
    step = ssca_step(deltas, np.ones(8), models, previous, p, 0)
    kept = previous >= 0
    assert np.array_equal(step.index[kept], previous[kept])
    assert step.index[3] != step.index[7]                    # new senders: by their cluster
    paper = ssca_step(deltas, np.ones(8), models, previous, SSCAParams(
        clusters=2, min_cluster_size=1), 0)
    assert len(set(paper.index[:4].tolist())) == 1 and len(set(paper.index[4:].tolist())) == 1


def test_clustered_run_records_groups_ari_and_per_group_accuracy(tmp_path):
    """A short run of the clustered benchmark: devices.parquet holds each device's group, the
    rows per-group ACC and, at every sync, the ARI of SSCA's clusters."""
    import pandas as pd

    import policies  # noqa: F401  (registers the presets)
    from raymm.app.api import run
    from raymm.config.schema import apply_overrides, read_yaml

    scenario = REPO / "scenarios" / "ssca_clustered.yaml"
    raw = apply_overrides(read_yaml(scenario),
                          ["rounds=4", "training.local_epochs=1", "population.devices=16",
                           "dataset.n_train=1600", "selection.k=16",
                           "aggregation.min_cluster_size=2"])
    res = run(raw, out=tmp_path, executor="serial")
    devices = pd.read_parquet(res.run_dir / "devices.parquet")
    assert devices["group"].tolist() == [g for g in range(4) for _ in range(4)]
    rows = pd.read_parquet(res.run_dir / "rounds.parquet")
    syncs = rows.dropna(subset=["ssca/clusters"])
    assert len(syncs) == 2 and syncs["ssca/ari"].between(-1, 1).all()
    evals = rows.dropna(subset=["accuracy"])
    assert {f"acc_group/{g}" for g in range(4)} <= set(evals.columns)
