"""A learning rate far too large stops the run with a message naming the round and devices;
the run directory is complete and its model finite."""

import json

import numpy as np
import pandas as pd

import raymm
from raymm.app.cli import main
from raymm.server.divergence import diverged

from helpers import tiny_scenario


def test_diverged_names_devices_or_the_model():
    ids = np.array([3, 5, 9])
    ok = {"g": np.ones(4, np.float32)}
    assert diverged(ids, np.array([0.1, 0.2, 0.3]), ok) is None
    assert diverged(ids, np.array([0.1, np.nan, np.inf]), ok) == [5, 9]
    assert diverged(ids, np.zeros(3), {"g": np.array([1.0, np.inf], np.float32)}) == []


def test_huge_learning_rate_stops_with_a_message(tmp_path, capsys):
    import yaml

    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(tiny_scenario(rounds=6, **{"training.lr": 1e30})))
    out = tmp_path / "runs"
    assert main(["run", str(p), "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("raymm:") == 1 and "training diverged" in err, err
    assert "round 1:" in err and "Lower training.lr (now 1e+30)" in err
    (run_dir,) = out.iterdir()
    summary = json.loads((run_dir / "summary.json").read_text())
    rounds = pd.read_parquet(run_dir / "rounds.parquet")
    assert summary["rounds_completed"] == 1 == len(rounds)
    net = raymm.load_model(run_dir)
    assert all(np.isfinite(p.detach().numpy()).all() for p in net.parameters())
