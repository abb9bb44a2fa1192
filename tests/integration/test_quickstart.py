"""The quickstart scenario on Ray writes every file a run directory promises."""

import json

import pandas as pd
import pytest
import yaml

from raymm.app.api import run

from helpers import REPO

SUMMARY_KEYS = {"name", "seed", "rounds_completed", "final_accuracy", "best_accuracy",
                "bytes_up", "bytes_down", "wall_seconds", "sim_seconds", "devices",
                "mean_selected"}


@pytest.mark.ray
def test_quickstart_on_ray_writes_the_run_directory(tmp_path, ray_session):
    res = run(REPO / "scenarios" / "quickstart.yaml", ["rounds=6", "eval.every=3"],
              out=tmp_path, executor="ray")
    d = res.run_dir
    assert d.parent == tmp_path and d.name.startswith("quickstart-")
    config = yaml.safe_load((d / "config.yaml").read_text())
    assert config["rounds"] == 6 and config["execution"]["executor"] == "ray"
    summary = json.loads((d / "summary.json").read_text())
    assert SUMMARY_KEYS <= summary.keys()
    assert summary["rounds_completed"] == 6 and summary["devices"] == 40
    assert summary["mean_selected"] == 10 and summary["bytes_up"] > 0
    rounds = pd.read_parquet(d / "rounds.parquet")
    assert rounds["round"].tolist() == list(range(1, 7))
    assert {"online", "selected", "bytes_up", "bytes_down", "sim_seconds", "wall_seconds",
            "train_loss", "accuracy"} <= set(rounds.columns)
    assert rounds["accuracy"].notna().tolist() == [False, False, True, False, False, True]
    devices = pd.read_parquet(d / "devices.parquet")
    assert len(devices) == 40
    assert {"sensors", "tier", "pattern", "times_selected", "samples"} <= set(devices.columns)
    assert devices["times_selected"].sum() == rounds["selected"].sum()
    assert set(devices["sensors"]) == {"left+right", "left", "right"}

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = list(d.glob("events.out.tfevents.*"))
    assert events
    acc = EventAccumulator(str(d))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"accuracy/all_sensors", "loss/train", "traffic/bytes_up", "traffic/bytes_down",
            "devices/online", "devices/selected", "time/sim_seconds_per_round",
            "time/wall_seconds_per_round"} <= tags
    assert [e.step for e in acc.Scalars("devices/selected")] == list(range(1, 7))
