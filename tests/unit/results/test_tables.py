import numpy as np
import pandas as pd
import pytest

from raymm.app.api import run
from raymm.app.cli import main
from raymm.errors import RaymmError
from raymm.results.compare import find_runs
from raymm.results.tables import compare, write_comparison

from helpers import tiny_scenario


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


def test_compare_rejects_non_runs(tmp_path, capsys):
    with pytest.raises(RaymmError, match="neither a run directory"):
        find_runs([tmp_path])
    assert main(["compare", str(tmp_path)]) == 2


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
