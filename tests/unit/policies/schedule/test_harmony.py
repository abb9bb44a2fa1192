"""Harmony's two stages as a schedule (policies.schedule.harmony): who trains what, when; the
method's rules; and in runs, each stage trains and moves only its groups, on the FedMChain
protocol too."""

from __future__ import annotations

import numpy as np
import pytest

import policies
from policies.schedule.harmony import HarmonyParams, HarmonySchedule, fusion_start
from raymm.app.api import run
from raymm.app.build import build_world, load_scenario
from raymm.app.variants import method_variant
from raymm.config.schema import read_yaml
from raymm.errors import ScenarioError
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
