"""The adaptive chain order and TIDE's adaptive weights end to end: what a run
records, exact resume (the decisions and the bandit are checkpointed), and Ray == serial."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from raymm.app.api import run
from raymm.driver.checkpoint import load

from helpers import REPO, resume_from_round_3, tiny_scenario

CHAIN = REPO / "scenarios" / "fedmchain_synthetic.yaml"
# probe rounds 1-2, then four phases of two rounds (the fourth revisits a modality)
CHAIN_SETTINGS = ["rounds=10", "schedule.order=adaptive", "schedule.probe_rounds=2",
                  "training.sync_every=2", "eval.every=3", "output.checkpoint_every=3",
                  "output.keep_checkpoints=5", "output.tensorboard=false",
                  "execution.actor.num_cpus=1"]


def tide(**kw: object) -> dict:
    return tiny_scenario(method="tide", rounds=9, **{
        "selection": {"name": "tide", "k": 5, "weights": "adaptive"},
        "aggregation": {"name": "tide", "warmup": 2}, "eval.every": 2,
        "output.checkpoint_every": 3, "output.keep_checkpoints": 5,
        "execution.devices_per_actor": 6, **kw})


def table(run_dir: Path) -> pd.DataFrame:
    return pd.read_parquet(run_dir / "rounds.parquet").drop(columns=["wall_seconds"])


def assert_same_run(a, b) -> None:  # noqa: ANN001
    for g in a.params:
        assert np.array_equal(a.params[g], b.params[g]), g
    pd.testing.assert_frame_equal(table(a.run_dir), table(b.run_dir), check_exact=True)


def test_adaptive_chain_records_its_order_and_resumes_exactly(tmp_path: Path) -> None:
    ref = run(CHAIN, CHAIN_SETTINGS, out=tmp_path, executor="serial")
    rounds = table(ref.run_dir)
    order = json.loads((ref.run_dir / "summary.json").read_text())["phase_order"]
    assert order[0] == "probe" and len(order) == 5 and set(order[1:4]) == {"dom", "mid", "weak"}
    assert rounds["phase"].tolist() == [o for o in order for _ in range(2)]
    assert rounds["chain/phase"].tolist() == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    # reports travel in round 1 and in the last round of every phase, and nowhere else
    reported = rounds["chain/accuracy/dom"].notna()
    assert reported.all() and rounds.loc[0, "bytes_up"] > 0     # round 1: reports only
    assert rounds.loc[2, "bytes_up"] == 0                       # round 3: no sync, no report
    assert load(ref.run_dir).server["schedule"]["kinds"].tolist()[:1] == [-1]
    res = resume_from_round_3(tmp_path, ref)
    assert_same_run(ref, res)


def test_adaptive_weights_record_their_trajectory_and_resume_exactly(tmp_path: Path) -> None:
    ref = run(tide(), out=tmp_path)
    rounds = table(ref.run_dir)
    assert rounds["selection/arm"].tolist() == [0, 0, 0, 0, 1, 1, 2, 2, 3]
    summary = json.loads((ref.run_dir / "summary.json").read_text())
    assert [w["rounds"] for w in summary["selection_weights"]] == [4, 2, 2, 1]
    assert summary["selection_weights"][1]["alpha"] == 0.55
    # rewarded at the evaluations of rounds 4, 6, 8 and 9 (round 2 had nothing to gain from)
    assert load(ref.run_dir).server["selector"]["bandit"]["played"].tolist() == [True] * 4 + [False]
    res = resume_from_round_3(tmp_path, ref)
    assert_same_run(ref, res)


@pytest.mark.ray
def test_adaptive_chain_on_ray_equals_serial(tmp_path: Path, ray_session) -> None:
    serial = run(CHAIN, CHAIN_SETTINGS, out=tmp_path / "s", executor="serial")
    on_ray = run(CHAIN, CHAIN_SETTINGS + ["execution.devices_per_actor=12"], out=tmp_path / "r",
                 executor="ray")
    assert_same_run(serial, on_ray)


@pytest.mark.ray
def test_adaptive_weights_on_ray_equal_serial(tmp_path: Path, ray_session) -> None:
    serial = run(tide(), out=tmp_path / "s")
    on_ray = run(tide(**{"execution.executor": "ray"}), out=tmp_path / "r")
    assert_same_run(serial, on_ray)
