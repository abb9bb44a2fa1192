"""Acc@B, tier-restricted F1, worst-case drop, early stopping, the sweep table, and the bytes a
TIDE round puts on the wire (partial models, prototypes, class means) — all by hand."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from raymm.app.build import build_world, load_scenario
from raymm.device.host import DeviceHost
from raymm.driver.tracking import RunTracker, summary_metrics
from raymm.results.tables import compare, write_comparison
from raymm.server.metrics import acc_at_budget, less_equipped, pooled_f1, worst_drop
from raymm.server.server import Server
from raymm.units import GIB

ROWS = [
    {"round": 5, "bytes_total": 0.25 * GIB},
    {"round": 10, "accuracy": 0.5, "bytes_total": 0.5 * GIB, "tier_f1": 0.4,
     "worst_drop": 0.3, "worst_drop_sensor": "b"},
    {"round": 20, "accuracy": 0.7, "bytes_total": 1.0 * GIB, "tier_f1": 0.6,
     "worst_drop": 0.2, "worst_drop_sensor": "a", "acc_tier/a": 0.55},
    {"round": 30, "accuracy": 0.6, "bytes_total": 1.5 * GIB, "tier_f1": 0.65,
     "worst_drop": 0.1, "worst_drop_sensor": "a"},
]


def test_acc_at_budget() -> None:
    assert acc_at_budget(ROWS, 1.2) == 0.7
    assert acc_at_budget(ROWS, 1.0) == 0.7      # Ψ[t] ≤ B includes the boundary
    assert acc_at_budget(ROWS, 0.6) == 0.5      # B/2 for B = 1.2
    assert acc_at_budget(ROWS, 0.4) is None     # no evaluation within the budget
    assert acc_at_budget(ROWS, 99.0) == 0.7


def test_summary_reports_the_best_evaluation() -> None:
    s = summary_metrics(ROWS, 1.2)
    assert s["acc_at_budget"] == 0.7 and s["acc_at_half_budget"] == 0.5
    assert s["best_round"] == 20 and s["tier_f1"] == 0.6 and s["worst_drop"] == 0.2
    assert s["worst_drop_sensor"] == "a" and s["best_acc_tier/a"] == 0.55
    assert "acc_at_budget" not in summary_metrics(ROWS, None)


def test_worst_drop_and_pooled_f1() -> None:
    assert worst_drop(0.9, {"a": 0.6, "b": 0.8}) == (pytest.approx(0.3), "a")
    assert worst_drop(0.9, {"a": 0.7, "b": 0.7})[1] == "a"
    d, m = worst_drop(0.9, {})
    assert math.isnan(d) and m is None
    # pooled: y [0,1,0,1] vs [0,1,0,0]; class 0: P 2/3, R 1 → F1 .8; class 1: P 1, R ½ → 2/3
    y = np.array([0, 1])
    assert pooled_f1(y, [np.array([0, 1]), np.array([0, 0])], 2) == pytest.approx(
        (0.8 + 2 / 3) / 2)
    assert less_equipped([("a", "b"), ("a",), ("b",), ("a",)], ("a", "b")) == [("a",), ("b",)]


def test_tracker_budget_and_early_stopping() -> None:
    tr = RunTracker(budget_gib=1.0, patience=2)
    rows = [{"round": i, "accuracy": a, "bytes_total": g * GIB}
            for i, (a, g) in enumerate([(0.5, 0.2), (0.6, 0.4), (0.6, 0.8), (0.9, 1.1)])]
    assert [tr.update(dict(r)) for r in rows[:2]] == [False, False]
    third = dict(rows[2])
    assert tr.update(third) is False                      # 1 evaluation without improvement
    assert third["acc_at_budget"] == 0.6 and third["acc_at_half_budget"] == 0.6
    assert tr.update({"round": 99, "bytes_total": 0}) is False  # not an evaluation
    last = dict(rows[3])
    assert tr.update(last) is False and last["best_accuracy"] == 0.9
    assert last["acc_at_budget"] == 0.6                   # 1.1 GiB is over the budget
    assert tr.update({"round": 5, "accuracy": 0.9, "bytes_total": 2 * GIB}) is False
    assert tr.update({"round": 6, "accuracy": 0.8, "bytes_total": 2 * GIB}) is True
    assert RunTracker().update({"accuracy": 0.1, "bytes_total": 0}) is False


def fake_run(root: Path, name: str, seed: int, rows: list[dict], gib: float) -> Path:
    d = root / f"{name}-{seed}"
    d.mkdir()
    accs = [r["accuracy"] for r in rows if "accuracy" in r]
    summary = {"name": name, "seed": seed, "method": "m", "final_accuracy": accs[-1],
               "best_accuracy": max(accs), "gib_total": gib,
        "rounds_completed": rows[-1]["round"], "wall_seconds_per_round": 0.5,
        "tier_f1": 0.5, "worst_drop": 0.1, "worst_drop_sensor": "a"}
    (d / "summary.json").write_text(json.dumps(summary))
    cols = sorted({k for r in rows for k in r})
    pq.write_table(pa.table({c: [r.get(c) for r in rows] for c in cols}), d / "rounds.parquet")
    return d


def test_compare_with_a_budget_from_one_scenario(tmp_path: Path) -> None:
    a1 = fake_run(tmp_path, "tide", 1, ROWS, 1.0)
    a2 = fake_run(tmp_path, "tide", 2, ROWS, 2.0)
    b = fake_run(tmp_path, "fedavg", 1, [{"round": 10, "accuracy": 0.8,
                                          "bytes_total": 1.4 * GIB}], 1.4)
    comp = compare([a1, a2, b], budget_from="tide")   # B = mean(1.0, 2.0) = 1.5 GiB
    assert comp.budget_gib == 1.5
    assert [r["acc_at_budget"] for r in comp.runs] == [0.7, 0.7, 0.8]
    assert [r["acc_at_half_budget"] for r in comp.runs] == [0.5, 0.5, None]
    pq_path, md_path = write_comparison(comp, tmp_path / "out")
    assert pq.read_table(pq_path).column("acc_at_budget").to_pylist() == [0.7, 0.7, 0.8]
    md = md_path.read_text()
    # Final is the last evaluation (0.6 at round 30), Best the highest (0.7 at round 20)
    assert "| tide | 2 | 60.00 ± 0.00 | 70.00 ± 0.00 | 70.00 ± 0.00 | 50.00 ± 0.00 |" in md
    assert "| fedavg | 1 | 80.00 | 80.00 | 80.00 | – |" in md
    assert "| 1.500 ± 0.707 |" in md  # GiB over the two tide seeds
    # best 0.7 at round 20, 0.6 at the last evaluation: a fall of 10 points; none for fedavg
    assert [round(r["fall_after_best"], 12) for r in comp.runs] == [0.1, 0.1, 0.0]
    assert "| 30 ± 0 | – | 10.00 ± 0.00 | 0.500 ± 0.000 |" in md
    with pytest.raises(Exception, match="no run of scenario 'nope'"):
        compare([a1], budget_from="nope")


# --------------------------------------------------------------------------- bytes on the wire

TINY = {
    "name": "tiny_tide", "seed": 3, "rounds": 4, "method": "tide",
    "dataset": {"name": "synthetic", "classes": 2, "n_train": 60, "n_test": 20,
                "sensors": {"a": {"dim": 4, "informativeness": 1.0},
                            "b": {"dim": 3, "informativeness": 1.0}}},
    "population": {"devices": 6, "partition": {"kind": "iid"},
                   "tiers": [{"sensors": ["a", "b"], "count": 2}, {"sensors": ["a"], "count": 2},
                             {"sensors": ["b"], "count": 2}]},
    "model": {"encoder": "mlp", "embed_dim": 2, "hidden": 3, "fusion_dim": 4},
    "training": {"local_epochs": 1, "batch_size": 8},
    "selection": {"k": 6},
    "aggregation": {"warmup": 0},
    "execution": {"executor": "serial"},
    "output": {"tensorboard": False},
}


def one_round_bytes(raw: dict, prototypes: bool) -> tuple[Server, dict, np.ndarray]:
    world = build_world(load_scenario(raw))
    server = Server(world.scenario, world.dataset, world.population, world.policies)
    if prototypes:  # as if earlier rounds had produced a prototype for class 0
        server.policies.aggregator.load_state_dict(
            {"prototypes": np.zeros((2, 4), np.float32), "has_prototype": np.array([True, False])})
    host = DeviceHost(np.arange(6), world.population, world.dataset, world.host_spec)
    plan, bcast = server.plan(1, [host.report_online(1)])
    stats = server.aggregate(1, plan, [host.train(plan, bcast)]).row
    return server, stats, world.population.tier


def test_bytes_of_partial_models_prototypes_and_class_means() -> None:
    server, stats, tier = one_round_bytes(TINY, prototypes=True)
    # sensor:a = Linear(4,3) 15 + Linear(3,2) 8 + aux head Linear(2,2) 6; sensor:b = 12 + 8 + 6;
    # shared = fusion Linear(4,4) 20 + head Linear(4,2) 10; the adapter (22) never travels
    assert server.layout.sizes == {"sensor:a": 29, "sensor:b": 26, "shared": 30, "local": 22}
    # extras each way: prototypes 2×4 + mask 2 (down), class means 2×4 + counts 2 (up): 40 B
    down = {0: (29 + 26 + 30) * 4 + 40,          # both sensors
            1: (29 + 30) * 4 + 2 * 4 + 40,       # a only: + the frozen zero-input embedding of b
            2: (26 + 30) * 4 + 2 * 4 + 40}       # b only
    up = {0: (29 + 26 + 30) * 4 + 40, 1: (29 + 30) * 4 + 40, 2: (26 + 30) * 4 + 40}
    assert sorted(np.bincount(tier).tolist()) == [2, 2, 2]
    assert stats["bytes_down"] == 2 * sum(down.values()) == 1872
    assert stats["bytes_up"] == 2 * sum(up.values()) == 1840
    assert stats["bytes_total"] == 1872 + 1840


def test_bytes_of_plain_averaging_without_extras() -> None:
    raw = dict(TINY, method="tide_core")
    server, stats, _ = one_round_bytes(raw, prototypes=False)
    assert server.layout.sizes == {"sensor:a": 23, "sensor:b": 20, "shared": 30, "local": 22}
    assert stats["bytes_down"] == stats["bytes_up"] == 6 * (23 + 20 + 30) * 4
