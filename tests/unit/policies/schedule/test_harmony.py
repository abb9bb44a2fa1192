"""Harmony: the two stages (who trains what, when), the unimodal-then-fusion loss by hand, the
stage-1 models kept by unimodal devices, and early stopping counted in the fusion stage."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import policies
from policies.aggregation.harmony import HarmonyAggregation
from policies.objective.harmony import HarmonyObjective
from policies.schedule.harmony import HarmonyParams, HarmonySchedule, fusion_start
from raymm.app.api import run
from raymm.app.build import build_world, load_scenario
from raymm.app.variants import method_variant
from raymm.config.schema import read_yaml
from raymm.driver.tracking import RunTracker
from raymm.errors import ScenarioError
from raymm.models.network import ModelOutput
from raymm.protocol.messages import UpdateBatch
from raymm.protocol.observations import Observations
from raymm.protocol.seams import AggregationContext, LossInputs
from raymm.sim.serial import SerialExecutor

from helpers import REPO, tiny_scenario

SCENARIOS = REPO / "scenarios"
MASK = np.array([[1, 1], [1, 0], [0, 1]], bool)        # devices: both, a only, b only


def bound(rounds: int = 9, fusion: str = "concat", **kw) -> HarmonySchedule:
    s = HarmonySchedule(HarmonyParams(**kw))
    sc = load_scenario(tiny_scenario(**{"method": "harmony", "rounds": rounds,
                                        "model.fusion": fusion}))
    s.bind(sc, ("a", "b"))
    return s


def test_stage_boundary() -> None:
    assert fusion_start(9, 2 / 3) == 7          # R1 = 6
    assert fusion_start(300, 2 / 3) == 201
    assert fusion_start(3, 0.01) == 2 and fusion_start(3, 0.99) == 3   # both stages ≥ 1 round


def test_stages_decide_groups_and_who_may_train() -> None:
    s = bound()
    groups = ["sensor:a", "sensor:b", "shared"]
    assert s.active_groups(6, groups) == ("sensor:a", "sensor:b")
    assert s.eligible(6, MASK, ("a", "b")).tolist() == [True, True, True]
    assert s.phase(6) == "modality" and s.phase_span(6) == (1, 6) and s.frozen_groups(6) == ()
    assert s.active_groups(7, groups) == ("shared",)
    assert s.eligible(7, MASK, ("a", "b")).tolist() == [True, False, False]
    assert s.phase(7) == "fusion" and s.phase_span(9) == (7, 9)
    assert s.frozen_groups(7) == ("sensor:a", "sensor:b")      # sent once, not trained
    assert s.final_stage_start == 7
    tuned = bound(finetune_encoders=True)
    assert tuned.active_groups(7, groups) == tuple(groups) and tuned.frozen_groups(7) == ()
    late = bound(fusion="sum_logits")                  # the heads are the classifier
    assert late.active_groups(7, ["sensor:a", "sensor:b"]) == ("sensor:a", "sensor:b")


def test_loss_trains_each_unimodal_network_then_the_fused_prediction() -> None:
    obj = HarmonyObjective(None)
    obj.fusion_start = 7
    y = torch.tensor([0, 1])
    la, lb = torch.tensor([[2.0, 0.0], [0.0, 1.0]]), torch.tensor([[0.0, 3.0], [1.0, 1.0]])
    fused = torch.tensor([[5.0, 0.0], [0.0, 5.0]])
    out = ModelOutput(fused, None, {}, {"a": la, "b": lb})

    def inp(t: int, held: tuple[str, ...]) -> LossInputs:
        return LossInputs(out, y, torch.ones(2, 2), held, {}, {}, {}, t)

    ce_a, ce_b = F.cross_entropy(la, y), F.cross_entropy(lb, y)
    torch.testing.assert_close(obj.loss(inp(6, ("a", "b"))), ce_a + ce_b)
    torch.testing.assert_close(obj.loss(inp(6, ("b",))), ce_b)
    torch.testing.assert_close(obj.loss(inp(7, ("a", "b"))), F.cross_entropy(fused, y))


def test_a_multimodal_device_trains_each_branch_as_alone() -> None:
    """Summed unimodal losses: each encoder's gradient is that of its own unimodal loss."""
    torch.manual_seed(0)
    ea, eb = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    x, y = torch.randn(4, 3), torch.tensor([0, 1, 1, 0])
    out = ModelOutput(torch.zeros(4, 2), None, {}, {"a": ea(x), "b": eb(x)})
    obj = HarmonyObjective(None)
    obj.fusion_start = 2
    obj.loss(LossInputs(out, y, torch.ones(4, 2), ("a", "b"), {}, {}, {}, 1)).backward()
    alone = torch.nn.Linear(3, 2)
    alone.load_state_dict(ea.state_dict())
    F.cross_entropy(alone(x), y).backward()
    torch.testing.assert_close(ea.weight.grad, alone.weight.grad)


def test_unimodal_devices_keep_their_stage_one_network() -> None:
    agg = HarmonyAggregation(None)
    agg.fusion_start = 3
    obs = Observations.register(MASK, np.array([0, 1, 2]))

    def merge(t: int, params, rows):  # noqa: ANN001, ANN202
        agg.extras(t)
        b = UpdateBatch(np.array([0]), np.array([1]), np.zeros(1), np.zeros(1),
                        {g: np.asarray([r], np.float32) for g, r in rows.items()},
                        {g: np.array([0]) for g in rows}, {}, np.zeros(0, np.int64), ())
        return agg.aggregate(params, b, AggregationContext(t, ("a", "b"), obs, 0))

    p = {"sensor:a": np.zeros(2, np.float32), "sensor:b": np.zeros(1, np.float32)}
    p = merge(2, p, {"sensor:a": [1.0, 1.0], "sensor:b": [2.0]})       # end of stage 1
    assert agg.cluster_models() is None                                 # still stage 1
    agg.extras(3)
    clusters = agg.cluster_models()
    p = merge(3, p, {"sensor:a": [5.0, 5.0], "sensor:b": [6.0]})       # fusion fine-tuning
    assert clusters is not None
    assert clusters.clustered["sensor:a"].tolist() == [False, True, True]
    np.testing.assert_array_equal(clusters.params["sensor:a"][0], [1.0, 1.0])
    saved = agg.state_dict()
    again = HarmonyAggregation(None)
    again.load_state_dict(saved)
    np.testing.assert_array_equal(again.cluster_models().params["sensor:b"][0], [2.0])


def test_patience_counts_only_fusion_stage_evaluations() -> None:
    tr = RunTracker(patience=2, patience_from=5)
    rows = [(1, 0.5), (2, 0.2), (3, 0.2), (4, 0.1), (5, 0.3), (6, 0.3)]
    stops = [tr.update({"round": t, "accuracy": a, "bytes_total": 0}) for t, a in rows]
    assert stops == [False] * 5 + [True]            # rounds 5 and 6: two without a new best


def test_harmony_needs_unimodal_heads_and_its_schedule() -> None:
    with pytest.raises(ScenarioError) as err:
        load_scenario(tiny_scenario(**{"method": "harmony", "model.aux_heads": False}))
    assert "set model.aux_heads: true" in str(err.value)
    with pytest.raises(ScenarioError) as err:
        load_scenario(tiny_scenario(**{"method": "harmony", "schedule": {"name": "joint"}}))
    assert "harmony's stages" in str(err.value)


def test_each_stage_trains_and_moves_only_its_groups() -> None:
    sc = load_scenario(tiny_scenario(**{"method": "harmony", "rounds": 6}))
    ex = SerialExecutor()
    ex.start(build_world(sc))
    init = dict(ex.server.params)
    multi = np.flatnonzero(sc_mask(ex) == 2)
    snap = {}
    for t in range(1, 7):
        plan, bcast = ex.plan(t, ex.poll(t))
        stats = ex.aggregate(t, (plan, bcast), ex.train(t, (plan, bcast))).row
        snap[t] = dict(ex.server.params)
        if t >= 5:
            assert plan.active_groups == ("shared",) and np.isin(plan.selected, multi).all()
            assert stats["phase"] == "fusion"
    # stage 1 trained the unimodal networks only; the fusion stage only the fusion part
    np.testing.assert_array_equal(snap[4]["shared"], init["shared"])
    assert not np.array_equal(snap[4]["sensor:a"], init["sensor:a"])
    for g in ("sensor:a", "sensor:b"):
        np.testing.assert_array_equal(snap[6][g], snap[4][g])
    assert not np.array_equal(snap[6]["shared"], snap[4]["shared"])


def sc_mask(ex: SerialExecutor) -> np.ndarray:
    return ex.server.obs.sensor_mask.sum(axis=1)


def test_harmony_runs_on_the_fedmchain_protocol(tmp_path) -> None:
    raw = method_variant(read_yaml(SCENARIOS / "fedmchain_synthetic.yaml"), "harmony",
                         policies.PRESETS)
    assert raw["aggregation"]["name"] == "harmony_delta" and raw["training"]["sync_every"] == 2
    raw["rounds"] = 6
    res = run(raw, out=tmp_path)
    assert [r["phase"] for r in res.rows] == ["modality"] * 4 + ["fusion"] * 2
    assert res.summary["final_accuracy"] is not None
