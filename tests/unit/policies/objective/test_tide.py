"""TIDE's policies by hand: selection score, pod merging, prototypes, and every loss term."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from policies.aggregation.tide import (
    TideAggregation,
    TideAggregationParams,
    evidence_weights,
    update_prototypes,
)
from policies.objective.tide import (
    TideObjective,
    TideObjectiveParams,
    aux_head_loss,
    cross_sensor_loss,
    prototype_loss,
    prox_global,
)
from policies.selection.tide import (
    TideParticipationSelection,
    TideSelection,
    TideSelectionParams,
    tide_scores,
    tier_sizes,
    top_k,
)
from raymm.models.network import ModelOutput
from raymm.protocol.messages import UpdateBatch
from raymm.protocol.observations import Observations
from raymm.protocol.seams import AggregationContext, LossInputs, SelectionContext

LOG_1P_EM2 = math.log1p(math.exp(-2.0))  # -log softmax of a logit 2 against a logit 0

# --------------------------------------------------------------------------- selection


def observed() -> Observations:
    """5 devices: 0 holds both sensors (tier of 1), 1, 2, 4 the first only (3), 3 the second
    only (1). Data sizes 100, 50, 200, 100, 0; device 0 trained twice (1 s, 3 s), device 1 once
    (3 s), the others never."""
    mask = np.array([[1, 1], [1, 0], [1, 0], [0, 1], [1, 0]], dtype=bool)
    obs = Observations.register(mask, np.array([0, 1, 1, 2, 1]))
    obs.observe_online(np.arange(5), np.array([100, 50, 200, 100, 0]))
    obs.observe_trained(np.array([0, 1]), np.array([1.0, 3.0]))
    obs.observe_trained(np.array([0]), np.array([3.0]))
    return obs


def test_score_by_hand() -> None:
    # v = [1/3, 1/4, .5, .5, .5]; eta = [.5, .25, 1, .5, 0]; rho = [1, 1/3, 1/3, 1, 1/3]
    u = tide_scores(observed(), np.arange(5), 0.25, 0.35, 0.25)
    expected = [0.25 / 3 + 0.175 + 0.25, 0.0625 + 0.0875 + 0.25 / 3, 0.125 + 0.35 + 0.25 / 3,
                0.125 + 0.175 + 0.25, 0.125 + 0.0 + 0.25 / 3]
    np.testing.assert_allclose(u, expected, rtol=1e-12)
    assert tier_sizes(observed().sensor_mask).tolist() == [1, 3, 3, 1, 3]


def ctx(obs: Observations, eligible: list[int], k: int, t: int = 1) -> SelectionContext:
    return SelectionContext(t, np.arange(obs.n), np.array(eligible), k, obs,
                            np.random.default_rng(0))


def test_selection_top_k_and_fewer_online_than_k() -> None:
    sel = TideSelection(TideSelectionParams())
    assert sel.select(ctx(observed(), [0, 1, 2, 3, 4], 2)).tolist() == [2, 3]
    assert sel.select(ctx(observed(), [0, 1, 2, 3, 4], 3)).tolist() == [0, 2, 3]
    assert sel.select(ctx(observed(), [1, 4], 3)).tolist() == [1, 4]
    assert sel.select(ctx(observed(), [0, 1, 4], 2)).tolist() == [0, 1]


def test_ties_go_to_the_smaller_id() -> None:
    ids, scores = np.array([7, 3, 5, 9]), np.array([0.5, 0.7, 0.5, 0.5])
    assert top_k(ids, scores, 2).tolist() == [3, 5]
    assert top_k(ids, scores, 3).tolist() == [3, 5, 7]
    # two devices identical in every observation: the smaller id wins
    mask = np.ones((3, 2), dtype=bool)
    obs = Observations.register(mask, np.zeros(3, int))
    obs.observe_online(np.arange(3), np.array([10, 10, 10]))
    assert TideSelection(TideSelectionParams()).select(ctx(obs, [0, 1, 2], 2)).tolist() == [0, 1]


def test_participation_term_rewards_recent_selection() -> None:
    obs = observed()
    for t in range(1, 6):  # device 4 selected in 5 of the last 10 rounds
        obs.observe_selected(t, np.array([4]))
    base = tide_scores(obs, np.arange(5), 0.25, 0.35, 0.25)
    u = tide_scores(obs, np.arange(5), 0.25, 0.35, 0.25, participation=0.15)
    np.testing.assert_allclose(u - base, [0, 0, 0, 0, 0.15 * 0.5], atol=1e-15)
    assert TideParticipationSelection.Params().participation == 0.15
    # 0.5583 (dev 2) > 0.55 (dev 3) > 0.5083 (dev 0) > 0.2833 (dev 4) > 0.2333 (dev 1)
    sel = TideParticipationSelection(TideParticipationSelection.Params())
    assert sel.select(ctx(obs, [0, 1, 2, 3, 4], 4)).tolist() == [0, 2, 3, 4]
    assert sel.select(ctx(obs, [1, 4], 1)).tolist() == [4]
    assert TideSelection(TideSelectionParams()).select(ctx(obs, [1, 4], 1)).tolist() == [1]


# --------------------------------------------------------------------------- aggregation


def batch(ids: list[int], n: list[int], updates: dict[str, list[list[float]]],
          senders: dict[str, list[int]], extras: dict[str, np.ndarray] | None = None
          ) -> UpdateBatch:
    return UpdateBatch(np.array(ids), np.array(n), np.zeros(len(ids)), np.zeros(len(ids)),
                       {g: np.array(v, np.float32) for g, v in updates.items()},
                       {g: np.array(v) for g, v in senders.items()}, extras or {},
                       np.zeros(0, np.int64), ())


GLOBAL = {"sensor:a": np.array([1.0, 1.0], np.float32),
          "sensor:b": np.array([9.0, 9.0], np.float32), "shared": np.array([0.0], np.float32)}
ACTX = AggregationContext(1, ("a", "b"), observed(), 0)


def test_pod_merging_keeps_a_group_no_pod_member_sent() -> None:
    # devices 0 (1 sample) and 1 (3 samples) both hold only sensor a: nobody sends sensor:b
    b = batch([0, 1], [1, 3], {"sensor:a": [[1, 2], [5, 6]], "shared": [[0], [4]]},
              {"sensor:a": [0, 1], "shared": [0, 1]})
    out = TideAggregation(TideAggregationParams()).aggregate(GLOBAL, b, ACTX)
    np.testing.assert_array_equal(out["sensor:a"], [4.0, 5.0])   # (1·[1,2] + 3·[5,6]) / 4
    np.testing.assert_array_equal(out["shared"], [3.0])          # (1·0 + 3·4) / 4
    np.testing.assert_array_equal(out["sensor:b"], [9.0, 9.0])   # kept
    np.testing.assert_array_equal(GLOBAL["sensor:a"], [1.0, 1.0])  # input not mutated


def test_pod_merging_averages_each_sensor_over_its_pod_only() -> None:
    # device 0 holds a and b (2 samples), device 1 only b (2), device 2 only a (6)
    b = batch([0, 1, 2], [2, 2, 6],
              {"sensor:a": [[0, 0], [8, 8]], "sensor:b": [[2, 2], [4, 6]],
               "shared": [[1], [2], [3]]},
              {"sensor:a": [0, 2], "sensor:b": [0, 1], "shared": [0, 1, 2]})
    out = TideAggregation(TideAggregationParams()).aggregate(GLOBAL, b, ACTX)
    np.testing.assert_allclose(out["sensor:a"], [6.0, 6.0])      # (2·0 + 6·8) / 8
    np.testing.assert_allclose(out["sensor:b"], [3.0, 4.0])      # (2·[2,2] + 2·[4,6]) / 4
    np.testing.assert_allclose(out["shared"], [2.4])             # (2 + 4 + 18) / 10


def test_evidence_weighting() -> None:
    # weights |X_i|·exp(-loss): 1·e^0 = 1 and 3·e^{-ln 3} = 1: equal, so the plain mean
    aux = np.array([[0.0, np.nan], [math.log(3.0), np.nan]], np.float32)
    b = batch([0, 1], [1, 3], {"sensor:a": [[1, 2], [5, 6]], "shared": [[0], [4]]},
              {"sensor:a": [0, 1], "shared": [0, 1]}, {"aux_loss": aux})
    agg = TideAggregation(TideAggregationParams(weighting="evidence"))
    out = agg.aggregate(GLOBAL, b, ACTX)
    np.testing.assert_allclose(out["sensor:a"], [3.0, 4.0], rtol=1e-6)
    np.testing.assert_array_equal(out["shared"], [3.0])  # shared stays data-size weighted
    np.testing.assert_allclose(evidence_weights(np.array([2, 2, 4]), np.array([1.0, 2.0, np.nan]),
                                                1.0), [2.0, 2.0 / math.e, 0.0])
    with pytest.raises(RuntimeError, match="report_aux_loss"):
        agg.aggregate(GLOBAL, batch([0], [1], {"sensor:a": [[1, 1]]}, {"sensor:a": [0]}), ACTX)


def test_prototype_update_by_hand() -> None:
    means = np.array([[[1, 1], [0, 0], [2, 0]], [[4, 4], [9, 9], [0, 0]]], np.float32)
    counts = np.array([[2, 0, 1], [1, 0, 0]])
    p, has = update_prototypes(None, None, means, counts, 0.5)
    np.testing.assert_allclose(p[0], [2, 2])          # (2·[1,1] + 1·[4,4]) / 3
    np.testing.assert_allclose(p[2], [2, 0])
    assert has.tolist() == [True, False, True]
    p2, has2 = update_prototypes(p, has, np.array([[[4, 0], [6, 6], [7, 7]]], np.float32),
                                 np.array([[1, 2, 0]]), 0.5)
    np.testing.assert_allclose(p2, [[3, 1], [6, 6], [2, 0]])  # 0.5·old + 0.5·new; first; kept
    assert has2.tolist() == [True, True, True]


def test_prototypes_accumulate_from_round_one_and_are_sent_after_warmup() -> None:
    agg = TideAggregation(TideAggregationParams(warmup=2))
    extras = {"class_means": np.array([[[1.0, 0.0], [0.0, 2.0]]], np.float32),
              "class_counts": np.array([[3, 0]], np.int32)}
    one = batch([0], [3], {"shared": [[1]]}, {"shared": [0]}, extras)
    for t in (1, 2):
        assert agg.extras(t) == {}
        agg.aggregate(GLOBAL, one, ACTX)
    sent = agg.extras(3)
    np.testing.assert_array_equal(sent["prototypes"], [[1, 0], [0, 0]])
    np.testing.assert_array_equal(sent["prototype_mask"], [1, 0])
    # the server asks again after aggregating round 3 (to count bytes): same payload
    agg.aggregate(GLOBAL, batch([0], [1], {"shared": [[1]]}, {"shared": [0]}, {
        "class_means": np.array([[[3.0, 0.0], [0.0, 5.0]]], np.float32),
        "class_counts": np.array([[1, 1]], np.int32)}), ACTX)
    assert agg.extras(3) is sent
    np.testing.assert_array_equal(agg.extras(4)["prototypes"], [[2, 0], [0, 5]])
    state = agg.state_dict()
    fresh = TideAggregation(TideAggregationParams(warmup=2))
    fresh.load_state_dict(state)
    np.testing.assert_array_equal(fresh.extras(4)["prototypes"], [[2, 0], [0, 5]])


# --------------------------------------------------------------------------- losses


def test_prox_excludes_the_local_adapter() -> None:
    trainable = {"w": torch.tensor([1.0, 2.0]), "adapter.0.weight": torch.tensor([5.0])}
    anchor = {"w": torch.zeros(2), "adapter.0.weight": torch.zeros(1)}
    assert float(prox_global(trainable, anchor)) == 5.0


def test_aux_head_loss_averages_over_present_sensors() -> None:
    logits = {"a": torch.zeros(1, 2), "b": torch.tensor([[math.log(3.0), 0.0]])}
    y = torch.tensor([0])
    both = aux_head_loss(logits, y, torch.ones(1, 2))
    assert float(both) == pytest.approx((math.log(2) + math.log(4 / 3)) / 2)
    only_a = aux_head_loss(logits, y, torch.tensor([[1.0, 0.0]]))
    assert float(only_a) == pytest.approx(math.log(2))


def test_cross_sensor_loss_by_hand() -> None:
    e = torch.eye(2)  # two samples, orthogonal embeddings, identical across sensors
    # ω = I / 0.5: each row and column is softmax([2, 0]) at its own index
    loss = cross_sensor_loss({"a": e, "b": e.clone()}, torch.ones(2, 2), 0.5)
    assert float(loss) == pytest.approx(LOG_1P_EM2)
    # asymmetric: ω = [[2, 2], [0, 0]]. Rows: softmax([2,2])_0 = softmax([0,0])_1 = ½.
    # Columns: [2, 0] at index 0 → log(1 + e^-2); [2, 0] at index 1 → log(1 + e^2)
    eb = torch.tensor([[1.0, 0.0], [1.0, 0.0]])
    expected = (2 * math.log(2) + math.log1p(math.exp(-2)) + math.log1p(math.exp(2))) / 4
    assert float(cross_sensor_loss({"a": e, "b": eb}, torch.ones(2, 2), 0.5)) == \
        pytest.approx(expected)
    # the pair is left out of a batch where modality dropout zeroed sensor b
    assert float(cross_sensor_loss({"a": e, "b": eb}, torch.tensor([[1.0, 0.0]] * 2), 0.5)) == 0


def test_single_sensor_device_has_zero_cross_sensor_loss_and_gradient() -> None:
    ea = torch.randn(4, 3, requires_grad=True)
    eb = torch.zeros(4, 3)  # the missing sensor's branch
    loss = cross_sensor_loss({"a": ea, "b": eb}, torch.tensor([[1.0, 0.0]] * 4), 0.3)
    assert float(loss.detach()) == 0.0
    loss.backward()
    assert ea.grad is not None and float(ea.grad.abs().sum()) == 0.0


def test_prototype_loss_by_hand() -> None:
    protos = torch.tensor([[1.0, 0.0], [0.0, 1.0], [5.0, 5.0]])
    mask = torch.tensor([1.0, 1.0, 0.0])  # class 2 has no prototype yet
    z = torch.tensor([[3.0, 0.0]])
    assert float(prototype_loss(z, torch.tensor([0]), protos, mask, 0.5)) == \
        pytest.approx(LOG_1P_EM2)
    # a sample of a class without prototype is left out; class 2 is not in the softmax
    z2 = torch.tensor([[3.0, 0.0], [1.0, 1.0]])
    assert float(prototype_loss(z2, torch.tensor([0, 2]), protos, mask, 0.5)) == \
        pytest.approx(LOG_1P_EM2)


def loss_inputs(extras: dict[str, torch.Tensor]) -> LossInputs:
    e = torch.eye(2)
    out = ModelOutput(logits=torch.zeros(2, 2), z=torch.ones(2, 2) * 7,
                      embeddings={"a": e, "b": e.clone()},
                      sensor_logits={"a": torch.zeros(2, 2), "b": torch.zeros(2, 2)},
                      z_base=torch.tensor([[3.0, 0.0], [0.0, 2.0]]))
    return LossInputs(out, torch.tensor([0, 1]), torch.ones(2, 2), ("a", "b"),
                      {"w": torch.tensor([1.0]), "adapter.x": torch.tensor([4.0])},
                      {"w": torch.tensor([0.0]), "adapter.x": torch.tensor([0.0])}, extras, 5)


def test_full_objective_is_the_weighted_sum() -> None:
    p = TideObjectiveParams(mu=0.5, lambda_cs=0.25, lambda_p=2.0, lambda_h=0.1, kappa_c=0.5,
                            kappa_p=0.5)
    obj = TideObjective(p)
    ln2 = math.log(2)
    # task ln 2, prox 1, heads ln 2, cross-sensor log(1+e^-2); no prototypes before warm-up
    before = ln2 + 0.5 * 1.0 + 0.1 * ln2 + 0.25 * LOG_1P_EM2
    assert float(obj.loss(loss_inputs({}))) == pytest.approx(before)
    protos = {"prototypes": torch.eye(2), "prototype_mask": torch.ones(2)}
    # z_base (not the adapted z) against the prototypes: cos = I, logits I/0.5
    assert float(obj.loss(loss_inputs(protos))) == pytest.approx(before + 2.0 * LOG_1P_EM2)
    assert obj.uses_adapter


def test_modality_dropout() -> None:
    xb = {"a": torch.ones(3, 2), "b": torch.ones(3, 2)}
    present = torch.ones(3, 2)
    gen = torch.Generator().manual_seed(0)
    always = TideObjective(TideObjectiveParams(dropout=1.0))
    out, pres = always.augment(xb, present, ("a", "b"), ("a", "b"), gen)
    dropped = [m for m in ("a", "b") if float(out[m].abs().sum()) == 0.0]
    assert len(dropped) == 1
    j = ("a", "b").index(dropped[0])
    assert pres[:, j].tolist() == [0.0] * 3 and pres[:, 1 - j].tolist() == [1.0] * 3
    assert float(xb["a"].sum() + xb["b"].sum()) == 12.0 and float(present.sum()) == 6.0
    # single-sensor devices and dropout 0 are untouched (and draw nothing)
    state = gen.get_state()
    assert always.augment(xb, present, ("a",), ("a", "b"), gen)[0] is xb
    never = TideObjective(TideObjectiveParams(dropout=0.0))
    assert never.augment(xb, present, ("a", "b"), ("a", "b"), gen)[0] is xb
    assert torch.equal(gen.get_state(), state)
    # about a fifth of the batches at the default rate
    rate = TideObjective(TideObjectiveParams())
    g = torch.Generator().manual_seed(1)
    hits = sum(rate.augment(xb, present, ("a", "b"), ("a", "b"), g)[0] is not xb
               for _ in range(2000))
    assert 0.17 < hits / 2000 < 0.23


def test_device_extras_class_means_and_aux_losses() -> None:
    from raymm.config.schema import ModelSpec
    from raymm.models import MultimodalNet

    torch.manual_seed(0)
    spec = ModelSpec(encoder="mlp", embed_dim=2, hidden=3, fusion_dim=4, aux_heads=True,
                     adapter=True)
    model = MultimodalNet(("a", "b"), {"a": (4,), "b": (3,)}, 3, spec)
    xs = {"a": torch.randn(5, 4), "b": torch.zeros(5, 3)}
    y = torch.tensor([0, 2, 0, 2, 2])
    held = torch.tensor([1.0, 0.0])
    obj = TideObjective(TideObjectiveParams(report_aux_loss=True))
    ex = obj.device_extras(model, xs, y, held, True)
    with torch.no_grad():
        out = model(xs, held.expand(5, -1), use_adapter=True)
    assert ex["class_counts"].tolist() == [2, 0, 3]
    np.testing.assert_allclose(ex["class_means"][0], out.z_base[[0, 2]].mean(0), rtol=1e-6)
    np.testing.assert_allclose(ex["class_means"][2], out.z_base[[1, 3, 4]].mean(0), rtol=1e-6)
    np.testing.assert_array_equal(ex["class_means"][1], [0, 0, 0, 0])
    ce = float(torch.nn.functional.cross_entropy(out.sensor_logits["a"], y))
    assert ex["aux_loss"][0] == pytest.approx(ce) and np.isnan(ex["aux_loss"][1])
    assert TideObjective(TideObjectiveParams(lambda_p=0.0)).device_extras(
        model, xs, y, held, True) == {}
