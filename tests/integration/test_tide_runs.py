"""Short TIDE runs end to end: same numbers whatever the packing or executor (Ray included),
pooled and personal (per-device, own adapter) evaluation side by side, and early stopping."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from raymm.app.api import RunResult, run

TINY: dict[str, Any] = {
    "name": "tiny_tide", "seed": 5, "rounds": 4, "method": "tide",
    "dataset": {"name": "synthetic", "classes": 3, "n_train": 240, "n_test": 60,
                "sensors": {"a": {"dim": 6, "informativeness": 1.0},
                            "b": {"dim": 5, "informativeness": 0.5}}},
    "population": {"devices": 9, "partition": {"kind": "dirichlet", "alpha": 0.5,
                                               "min_samples": 5},
                   "tiers": [{"sensors": ["a", "b"], "count": 3}, {"sensors": ["a"], "count": 3},
                             {"sensors": ["b"], "count": 3}],
                   "availability": [{"pattern": "always", "fraction": 0.5},
                                    {"pattern": "custom", "period": 3, "online": 2,
                                     "fraction": 0.5}],
                   "hardware": [{"gflops": 1.0, "jitter": 0.3}], "local_test_fraction": 0.25},
    "model": {"encoder": "mlp", "embed_dim": 4, "hidden": 8, "fusion_dim": 8},
    "training": {"local_epochs": 2, "batch_size": 8},
    "selection": {"k": 4},
    # prototypes from round 2 on; evidence weighting covers the per-device aux-loss extra
    "aggregation": {"warmup": 1, "weighting": "evidence"},
    "objective": {"report_aux_loss": True},
    "eval": {"every": 2, "scope": "both"},
    "execution": {"executor": "serial"},
    "output": {"tensorboard": False},
}

VOLATILE = {"wall_seconds"}


def assert_same_run(a: RunResult, b: RunResult) -> None:
    assert a.params.keys() == b.params.keys()
    for g in a.params:
        assert a.params[g].tobytes() == b.params[g].tobytes(), g
    assert len(a.rows) == len(b.rows)
    for ra, rb in zip(a.rows, b.rows):
        for k in set(ra) | set(rb):
            if k not in VOLATILE:
                assert ra.get(k) == rb.get(k) or (ra[k] != ra[k] and rb[k] != rb[k]), k


def tiny(**execution: Any) -> dict[str, Any]:
    return dict(TINY, execution={**TINY["execution"], **execution})


def test_packing_does_not_change_a_tide_run(tmp_path: Path) -> None:
    one_host = run(tiny(), out=tmp_path)
    packed = run(tiny(devices_per_actor=2), out=tmp_path)
    assert_same_run(one_host, packed)
    s = one_host.summary
    assert 0 <= s["tier_f1"] <= 1 and s["worst_drop_sensor"] in ("a", "b")
    assert set(s) >= {"best_acc_head/a", "best_acc_head/b", "best_acc_tier/a", "best_round"}
    # pooled (global model) and personal (each device with its adapter) next to each other
    evals = [r for r in one_host.rows if r.get("accuracy") is not None]
    assert [r["round"] for r in evals] == [2, 4]
    assert all(r["personal_devices_evaluated"] == 9 for r in evals)
    assert s["final_personal_accuracy"] == evals[-1]["personal_accuracy"]
    assert s["best_personal_accuracy"] == max(r["personal_accuracy"] for r in evals)
    assert {"final_personal_acc_tier/a+b", "final_personal_acc_tier/a",
            "final_personal_acc_tier/b"} <= set(s)
    assert s["best_accuracy"] == max(r["accuracy"] for r in evals)


def test_early_stopping_after_patience_evaluations(tmp_path: Path) -> None:
    raw = dict(TINY, rounds=60, eval={"every": 1, "early_stop_patience": 2, "scope": "both"})
    res = run(raw, out=tmp_path)
    accs = [r["accuracy"] for r in res.rows]
    last = res.summary["rounds_completed"]
    assert last < 60 and len(accs) == last
    best = max(accs[:-2])
    assert accs[-1] <= best and accs[-2] <= best and max(accs[:-2]) == max(accs)


@pytest.mark.ray
def test_tide_on_ray_equals_serial(tmp_path: Path, ray_session) -> None:
    serial = run(tiny(), out=tmp_path)
    on_ray = run(tiny(executor="ray", devices_per_actor=6), out=tmp_path)
    assert on_ray.summary["executor"] == "ray"
    assert_same_run(serial, on_ray)


POOLED = ("accuracy", "test_loss", "tier_f1", "worst_drop", "acc_tier/a", "acc_tier/b",
          "acc_head/a", "bytes_total")


def test_the_adapter_cannot_move_the_global_model(tmp_path: Path) -> None:
    """With the adapter on its own path the global model is exactly the one trained without an
    adapter (random selection: TIDE's score would see the adapter's extra simulated compute),
    so every pooled metric is too; only the personal metrics differ. The earlier joint rule
    moves it."""
    def go(**objective: Any) -> RunResult:
        raw = dict(TINY, selection={"name": "random", "k": 4},
                   objective={**TINY["objective"], **objective})
        if objective.get("adapter") is False:
            raw["model"] = {**TINY["model"], "adapter": False}
        return run(raw, out=tmp_path)

    personal, free, joint = go(), go(adapter=False), go(adapter_path="joint")
    for g in free.params:
        assert personal.params[g].tobytes() == free.params[g].tobytes(), g
    evals = [(a, b) for a, b in zip(personal.rows, free.rows) if a.get("accuracy") is not None]
    assert len(evals) == 2
    for a, b in evals:
        assert all(a[k] == b[k] for k in POOLED), [(k, a[k], b[k]) for k in POOLED]
    assert any(a["personal_test_loss"] != b["personal_test_loss"] for a, b in evals)
    assert not np.array_equal(joint.params["shared"], free.params["shared"])
