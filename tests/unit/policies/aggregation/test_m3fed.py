"""M3Fed's server (policies.aggregation.m3fed): G's inverse-distance weights and angular
affinity by hand, spectral clustering of directions, one sync of the aggregator (global mean,
cluster models, G everywhere, assignments, state), and where G sits in raymm's network."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from policies.aggregation.m3fed import (
    M3FedAggParams,
    M3FedAggregator,
    angular_affinity,
    inverse_distance_weights,
    spectral_labels,
    weighted_mean,
)
from policies.objective.m3fed import CONSENSUS
from raymm.config.schema import ModelSpec
from raymm.errors import ScenarioError
from raymm.models import GroupLayout
from raymm.models.build import build_net
from raymm.models.network import SHARED
from raymm.protocol.messages import UpdateBatch
from raymm.protocol.observations import Observations
from raymm.protocol.seams import AggregationContext

from helpers import tiny_scenario


def test_consensus_weights_by_hand() -> None:
    # G = 0, 1, 3: distances 1, 3, 2 -> ω ∝ (1 + 1/3, 1 + 1/2, 1/3 + 1/2) = (4/3, 3/2, 5/6)
    # -> (0.3636, 0.4091, 0.2273); G = 0.4091 + 3·0.2273 = 1.0909
    g = np.array([[0.0], [1.0], [3.0]])
    w = inverse_distance_weights(g, 1e-10)
    np.testing.assert_allclose(w, [4 / 11, 9 / 22, 5 / 22], rtol=1e-9)
    np.testing.assert_allclose(w, [0.3636, 0.4091, 0.2273], atol=1e-4)
    assert weighted_mean(g, w)[0] == pytest.approx(1.0909, abs=1e-4)
    np.testing.assert_array_equal(inverse_distance_weights(np.array([[2.0, 5.0]]), 1e-10), [1])


def test_angular_affinity_by_hand() -> None:
    # u1 = (1, 0), u2 = (1, 1), u3 = (-1, 0): angles 45°, 180°, 135°
    u = np.array([[1.0, 0.0], [1.0, 1.0], [-1.0, 0.0]])
    a = angular_affinity(u @ u.T)
    np.testing.assert_allclose(a, [[1, 0.75, 0], [0.75, 1, 0.25], [0, 0.25, 1]], atol=1e-12)
    # a zero update has no direction: affinity 1/2 to the others
    z = np.array([[1.0, 0.0], [0.0, 0.0]])
    np.testing.assert_allclose(angular_affinity(z @ z.T), [[1, 0.5], [0.5, 1]])


def test_spectral_clustering_groups_directions() -> None:
    rng = np.random.default_rng(0)
    dirs = np.array([[1.0, 0, 0], [0, 1.0, 0], [0, 0, 1.0]])
    u = np.repeat(dirs, 3, axis=0) + 0.05 * rng.standard_normal((9, 3))
    lab = spectral_labels(angular_affinity(u @ u.T), 3, random_state=0)
    assert [len(set(lab[i:i + 3].tolist())) for i in (0, 3, 6)] == [1, 1, 1]
    assert len(set(lab.tolist())) == 3 and lab[0] == 0   # labelled by first appearance
    np.testing.assert_array_equal(spectral_labels(np.eye(3), 4, 0), [0, 1, 2])
    np.testing.assert_array_equal(spectral_labels(np.eye(3), 1, 0), [0, 0, 0])


def _batch(ids: list[int], samples: list[int], a: list[list[float]],
           shared: list[list[float]]) -> UpdateBatch:
    n = len(ids)
    return UpdateBatch(
        device_ids=np.array(ids), num_samples=np.array(samples),
        compute_seconds=np.zeros(n), loss=np.zeros(n),
        updates={"sensor:a": np.array(a, np.float32), SHARED: np.array(shared, np.float32)},
        senders={"sensor:a": np.arange(n), SHARED: np.arange(n)}, extras={},
        failed=np.zeros(0, np.int64), errors=())


def test_one_sync_by_hand_then_bases_from_cluster_models() -> None:
    agg = M3FedAggregator(M3FedAggParams(clusters=2))
    agg.g_size = 1   # E = 1: the last number of `shared` is G
    obs = Observations.register(np.ones((5, 1), bool), np.zeros(5, np.int64))
    params = {"sensor:a": np.zeros(2, np.float32), SHARED: np.array([0, 0, 1], np.float32)}
    # deltas of 4 devices (weights 1, 1, 2, 2): two up the first axis, two up the second;
    # G moves to 1 + (0, 1, 3, 3)... device 3's G equals device 2's
    batch = _batch([0, 1, 2, 3], [1, 1, 2, 2],
                   [[2, 0], [4, 0], [0, 1], [0, 3]],
                   [[1, 0, 0], [1, 0, 1], [0, 2, 3], [0, 2, 3]])
    out = agg.aggregate(params, batch, AggregationContext(1, ("a",), obs, seed=0))
    # global: sample-weighted means (6 in all): a = (6/6, 8/6), shared θ = (2/6, 8/6)
    np.testing.assert_allclose(out["sensor:a"], [1, 4 / 3], rtol=1e-6)
    np.testing.assert_allclose(out[SHARED][:2], [1 / 3, 4 / 3], rtol=1e-6)
    # G_i = 1, 2, 4, 4: distances (1,3,3), (1,2,2), (3,2,0), (3,2,0); ε = 1e-10 makes the
    # two equal G's weigh 1e10 each: G → 4
    assert out[SHARED][2] == pytest.approx(4.0, abs=1e-6)
    cm = agg.cluster_models()
    assert cm is not None
    idx = cm.assignment["sensor:a"]
    assert idx[0] == idx[1] != idx[2] == idx[3]
    np.testing.assert_array_equal(cm.clustered[SHARED], [True] * 4 + [False])
    a, b = idx[0], idx[2]
    np.testing.assert_allclose(cm.params["sensor:a"][a], [3, 0])
    np.testing.assert_allclose(cm.params["sensor:a"][b], [0, 2])
    np.testing.assert_allclose(cm.params[SHARED][a], [1, 0, 4], rtol=1e-6)
    np.testing.assert_allclose(cm.params[SHARED][b], [0, 2, 4], rtol=1e-6)
    assert agg.round_stats() == {"m3fed/clusters": 2.0}
    # sync 2: device 0's delta is against its cluster's model, device 4's against the global
    state = agg.state_dict()
    batch2 = _batch([0, 4], [1, 1], [[1, 1], [1, 1]], [[0, 0, 0], [0, 0, 0]])
    out2 = agg.aggregate(out, batch2, AggregationContext(2, ("a",), obs, seed=0))
    np.testing.assert_allclose(out2["sensor:a"], [(4 + 2) / 2, (1 + 7 / 3) / 2], rtol=1e-6)
    # a resumed aggregator makes the same sync
    again = M3FedAggregator(M3FedAggParams(clusters=2))
    again.g_size = 1
    again.load_state_dict(state)
    out3 = again.aggregate(out, batch2, AggregationContext(2, ("a",), obs, seed=0))
    for g in out2:
        np.testing.assert_array_equal(out2[g], out3[g])


def test_needs_the_consensus_projection() -> None:
    from raymm.app.build import load_scenario

    agg = M3FedAggregator(M3FedAggParams())
    plain = load_scenario(tiny_scenario())
    assert M3FedAggregator.check_scenario(agg.p, plain, ("a", "b"))
    with pytest.raises(ScenarioError):
        agg.bind(plain, ("a", "b"))
    sc = load_scenario(tiny_scenario(**{"model.consensus": True}))
    assert M3FedAggregator.check_scenario(agg.p, sc, ("a", "b")) == []
    agg.bind(sc, ("a", "b"))
    assert agg.g_size == 8 ** 2


@pytest.mark.parametrize("fusion", ["concat", "sum_logits"])
def test_g_is_the_last_block_of_shared_and_starts_as_the_identity(fusion: str) -> None:
    shapes: dict[str, tuple[int, ...]] = {"a": (8,), "b": (6,)}
    spec = ModelSpec.model_validate({"embed_dim": 4, "hidden": 8, "fusion_dim": 8,
                                     "fusion": fusion, "consensus": True})
    net = build_net(("a", "b"), shapes, 3, spec, 0)
    layout = GroupLayout(net)
    last = layout.slots[SHARED][-1]
    assert last.name == CONSENSUS and last.stop == layout.sizes[SHARED] \
        and last.stop - last.start == 4 ** 2
    np.testing.assert_array_equal(net.state_dict()[CONSENSUS], np.eye(4))
    # G = I: the same outputs as the network without G, built from the same seed
    plain = build_net(("a", "b"), shapes, 3, spec.model_copy(update={"consensus": False}), 0)
    x = {"a": torch.randn(5, 8), "b": torch.randn(5, 6)}
    present = torch.ones(5, 2)
    torch.testing.assert_close(net(x, present).logits, plain(x, present).logits)
    with pytest.raises(ValueError, match="one width"):
        build_net(("a", "b"), shapes, 3, spec.model_copy(update={"encoder": "identity"}), 0)
