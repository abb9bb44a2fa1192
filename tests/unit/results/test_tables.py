"""Tables of finished runs side by side (raymm.results.tables): the comparison table and plot
of two real runs (and `raymm compare`), a budget taken from one scenario's runs; and the
TensorBoard pictures and layout those runs wrote."""

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from raymm.app.api import run
from raymm.app.cli import main
from raymm.results.compare import find_runs
from raymm.results.tables import compare, write_comparison
from raymm.units import GIB

from helpers import BUDGET_ROWS, tiny_scenario


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("sweep")
    for seed in (1, 2):
        run(tiny_scenario(seed=seed, rounds=4, **{"output.tensorboard": True,
                                                   "eval.every": 2, "eval.scope": "both",
                                                   "population.local_test_fraction": 0.25}),
            out=out)
    return out


def test_compare_writes_table_and_plot(two_runs, tmp_path, capsys):
    runs = find_runs([two_runs])
    assert len(runs) == 2
    comp = compare(runs, budget_gib=0.001)
    write_comparison(comp, tmp_path / "cmp")
    assert [r["seed"] for r in comp.runs] == [1, 2]
    png = tmp_path / "cmp" / "accuracy_vs_gib.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = (tmp_path / "cmp" / "comparison.md").read_text()
    assert md.startswith("B = 0.001 GiB") and "| tiny | 2 |" in md  # 2 seeds in one row
    table = pd.read_parquet(tmp_path / "cmp" / "comparison.parquet")
    assert table.shape[0] == 2
    # personal accuracy (the last per-device evaluation) next to the pooled Final, as mean ± std
    personal = table["final_personal_accuracy"].to_numpy() * 100
    assert np.isfinite(personal).all()
    assert f"| {personal.mean():.2f} ± {personal.std(ddof=1):.2f} |" in md
    assert "| GiB | personal (%) | rounds |" in md
    assert main(["compare", str(two_runs), "--out", str(tmp_path / "c2")]) == 0
    assert "accuracy_vs_gib.png" in capsys.readouterr().out
    assert (tmp_path / "c2" / "accuracy_vs_gib.png").exists()


def test_tensorboard_pictures_and_layout(two_runs):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir = find_runs([two_runs])[0]
    acc = EventAccumulator(str(run_dir), size_guidance={"images": 0})
    acc.Reload()
    images = set(acc.Tags()["images"])
    assert {"partition/labels_per_device", "partition/sensors_per_device",
            "availability/online_timeline", "availability/online_and_selected",
            "curves/accuracy_vs_GiB", "evaluation/confusion_matrix"} <= images
    assert [e.step for e in acc.Images("evaluation/confusion_matrix")] == [2, 4]
    img = acc.Images("partition/labels_per_device")[0]
    assert img.width > 200 and img.height > 200
    assert {"scenario/text_summary", "custom_scalars__config__"} <= set(acc.Tags()["tensors"])
    # eval.scope: both: the personal (per-device) accuracy next to the pooled one
    scalars = set(acc.Tags()["scalars"])
    assert {"accuracy/all_sensors", "accuracy_personal/all_devices", "accuracy_personal_tier/a",
            "accuracy_personal_tier/a+b", "accuracy_tier/a"} <= scalars
    assert [e.step for e in acc.Scalars("accuracy_personal/all_devices")] == [2, 4]
    # the confusion matrix adds up to the test set (kept out of the tables)
    rounds = pd.read_parquet(run_dir / "rounds.parquet")
    assert not any(c.startswith("_") for c in rounds.columns)
    assert np.isfinite(rounds["accuracy"].dropna()).all()


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
    a1 = fake_run(tmp_path, "tide", 1, BUDGET_ROWS, 1.0)
    a2 = fake_run(tmp_path, "tide", 2, BUDGET_ROWS, 2.0)
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
