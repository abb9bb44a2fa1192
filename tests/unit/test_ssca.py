"""SSCA, step by step, on small hand-made inputs with hand-computed outputs."""

from __future__ import annotations

import numpy as np
import pytest

from policies.aggregation.ssca import (
    SSCA,
    SSCAParams,
    cluster_consensus,
    cluster_signs,
    consistency,
    match_clusters,
    merge,
    sparsify,
    ssca_step,
)
from raymm.messages import UpdateBatch
from raymm.observations import Observations
from raymm.policy import AggregationContext


def test_sparsify_keeps_top_kappa_by_magnitude() -> None:
    d = np.array([[4.0, -2.0, 2.0, -1.0, -3.0, -4.0],
                  [0.1, 0.5, -0.2, 0.0, 0.0, 0.3]])
    # κ = 0.5 of 6 coordinates -> the 3 largest |.| per row
    out = sparsify(d, 0.5)
    np.testing.assert_array_equal(out, [[4, 0, 0, 0, -3, -4], [0, 0.5, -0.2, 0, 0, 0.3]])
    np.testing.assert_array_equal(np.sign(out), [[1, 0, 0, 0, -1, -1], [0, 1, -1, 0, 0, 1]])
    # ceil(0.3 · 4) = 2 kept; a tie at the threshold keeps both tied coordinates
    np.testing.assert_array_equal(sparsify(np.array([[1.0, -3.0, 1.0, 0.5]]), 0.3),
                                  [[1, -3, 1, 0]])
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


def test_ssca_step_updates_matched_models_only() -> None:
    deltas = np.array([[1.0, 2.0, -1.0, 0.1], [1.0, 2.0, -1.0, 0.1],
                       [-1.0, -2.0, -1.0, 0.1]], np.float32)
    w = np.array([1.0, 1.0, 2.0])
    models = np.zeros((3, 4), np.float32)
    models[2] = 10.0
    p = SSCAParams(kappa=0.75, clusters=3, pi=0.9, lambda_merge=0.5)
    step = ssca_step(deltas, w, models, np.array([1, 1, 0]), p, random_state=0)
    # sparse: ceil(0.75·4) = 3 kept -> the 0.1 entries drop; clusters {0,1} and {2}
    assert step.labels[0] == step.labels[1] != step.labels[2]
    # cons A = [1, 2, -1, 0] (α 2), cons B = [-1, -2, -1, 0] (α 2): ρ = [.5, .5, 1, 0]
    np.testing.assert_allclose(step.rho, [0.5, 0.5, 1.0, 0.0], atol=1e-9)
    # q2 merges to -1 in both; q0, q1 keep their own clusters'; members keep models 1 and 0
    np.testing.assert_array_equal(step.index, [1, 1, 0])
    np.testing.assert_allclose(step.models[1], 0.5 * np.array([1, 2, -1, 0]))
    np.testing.assert_allclose(step.models[0], 0.5 * np.array([-1, -2, -1, 0]))
    np.testing.assert_allclose(step.models[2], 10.0)  # no cluster matched it


def test_aggregator_keeps_cluster_models_assignment_and_consensus() -> None:
    agg = SSCA(SSCAParams(kappa=1.0, clusters=2, pi=0.9, lambda_merge=1.0))
    assert agg.cluster_models() is None
    obs = Observations.register(np.ones((4, 1), bool), np.zeros(4, np.int64))
    obs.observe_online(np.arange(4), np.array([1, 1, 2, 5]))
    batch = UpdateBatch(
        device_ids=np.array([0, 1, 2]), num_samples=np.array([1, 1, 2]),
        compute_seconds=np.zeros(3), loss=np.zeros(3),
        updates={"sensor:a": np.array([[1, 1], [1, 1], [-1, -1]], np.float32)},
        senders={"sensor:a": np.array([0, 1, 2])}, extras={},
        failed=np.zeros(0, np.int64), errors=())
    params = {"sensor:a": np.array([5.0, 5.0], np.float32)}
    out = agg.aggregate(params, batch, AggregationContext(1, ("a",), obs, seed=0))
    cm = agg.cluster_models()
    assert cm is not None
    # devices 0,1 previously k=0 -> their cluster keeps model 0; device 2 gets model 1
    np.testing.assert_array_equal(cm.assignment["sensor:a"], [0, 0, 1, 0])
    np.testing.assert_array_equal(cm.clustered["sensor:a"], [True, True, True, False])
    np.testing.assert_allclose(cm.params["sensor:a"], [[6, 6], [4, 4]])
    # consensus weighted by the samples assigned to each model: (2·6 + 2·4)/4
    np.testing.assert_allclose(out["sensor:a"], [5.0, 5.0])
    assert params["sensor:a"][0] == 5.0  # input not mutated


@pytest.mark.parametrize("kappa", [0.1, 0.5, 1.0])
def test_sparsify_keeps_at_least_ceil_kappa(kappa: float) -> None:
    d = np.random.default_rng(0).standard_normal((5, 37))
    kept = (sparsify(d, kappa) != 0).sum(axis=1)
    assert (kept == int(np.ceil(kappa * 37))).all()
