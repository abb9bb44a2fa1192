"""Finished runs back as pandas tables (`raymm.load_runs`, raymm.results.runs): runs at any
depth, one run, a list and nothing; without torch or Ray."""

from __future__ import annotations

import json
import subprocess
import sys

import pandas as pd
import pytest

import raymm
from raymm.app.api import run
from raymm.errors import RaymmError
from raymm.results.compare import find_runs
from raymm.results.runs import RUN_COLUMNS, load_runs

from helpers import REPO, tiny_scenario


@pytest.fixture(scope="module")
def runs_tree(tmp_path_factory):
    """Three small serial runs at different depths: out/a/<run>, out/b/deeper/<run> (two)."""
    out = tmp_path_factory.mktemp("runs")
    run(tiny_scenario(seed=1, rounds=4, **{"eval.every": 2}), out=out / "a")
    for seed, method in ((2, "fedavg"), (3, "fedprox")):
        run(tiny_scenario(seed=seed, rounds=3, method=method, name=f"tiny_{method}"),
            out=out / "b" / "deeper")
    return out


def test_load_runs_finds_runs_at_any_depth(runs_tree):
    runs = raymm.load_runs(runs_tree)
    assert isinstance(runs.rounds, pd.DataFrame) and isinstance(runs.summaries, pd.DataFrame)
    assert len(runs) == 3
    s = runs.summaries
    assert tuple(s.columns[:len(RUN_COLUMNS)]) == RUN_COLUMNS
    assert sorted(s["seed"]) == [1, 2, 3]
    assert s.set_index("seed")["method"].to_dict() == {1: "fedavg", 2: "fedavg", 3: "fedprox"}
    assert s.set_index("seed")["name"].to_dict() == {1: "tiny", 2: "tiny_fedavg",
                                                     3: "tiny_fedprox"}
    # every key of each summary.json is a column, with its value
    for _, row in s.iterrows():
        summary = json.loads((runs_tree.joinpath(row["run_dir"]) / "summary.json").read_text())
        assert row["run"] == runs_tree.joinpath(row["run_dir"]).name
        assert row["final_accuracy"] == summary["final_accuracy"]
        assert row["rounds_completed"] == summary["rounds_completed"]
    # the rounds: one row per (run, round), the run's columns first, the table's own after
    r = runs.rounds
    assert tuple(r.columns[:len(RUN_COLUMNS)]) == RUN_COLUMNS
    assert r.groupby("seed")["round"].apply(list).to_dict() == {1: [1, 2, 3, 4],
                                                                2: [1, 2, 3], 3: [1, 2, 3]}
    for run_dir, part in r.groupby("run_dir"):
        own = pd.read_parquet(f"{run_dir}/rounds.parquet")
        mine = part.drop(columns=list(RUN_COLUMNS)).reset_index(drop=True)[own.columns]
        pd.testing.assert_frame_equal(mine, own, check_dtype=False)
    # rounds that were not evaluated have no accuracy (eval.every: 2)
    acc = r[r["seed"] == 1].set_index("round")["accuracy"]
    assert acc[[1, 3]].isna().all() and acc[[2, 4]].notna().all()
    # `raymm compare` finds the same runs
    assert [str(p) for p in find_runs([runs_tree])] == list(s["run_dir"])


def test_load_runs_of_one_run_a_list_and_nothing(runs_tree, tmp_path):
    one = next((runs_tree / "a").iterdir())
    runs = load_runs(one)
    assert len(runs) == 1 and list(runs.rounds["round"]) == [1, 2, 3, 4]
    both = load_runs([runs_tree / "a", runs_tree / "b", one])   # `one` twice: counted once
    assert len(both) == 3
    with pytest.raises(RaymmError, match="no run directory"):
        load_runs(tmp_path)
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "summary.json").write_text("{not json")
    with pytest.raises(RaymmError, match="summary.json is unreadable"):
        load_runs(tmp_path)
    (bad / "summary.json").write_text(json.dumps({"name": "x", "seed": 1}))
    (bad / "rounds.parquet").write_bytes(b"PAR1 damaged")
    with pytest.raises(RaymmError, match="rounds.parquet is unreadable"):
        load_runs(bad)


def test_load_runs_needs_neither_torch_nor_ray(runs_tree):
    """`import raymm; raymm.load_runs(...)` in a notebook loads pandas, not torch or Ray."""
    code = ("import sys, raymm\n"
            f"runs = raymm.load_runs({str(runs_tree)!r})\n"
            "assert len(runs) == 3\n"
            "print(sorted(m for m in ('torch', 'ray', 'matplotlib') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=REPO, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
