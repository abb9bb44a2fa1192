"""A sweep's jobs (raymm.app.sweep_plan): a grid times methods times seeds, grid values the
schema refuses or that differ only in unsafe characters refused by key, and a grid sweep that
skips, continues and refuses like a seed sweep."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from raymm.app.sweep import run_sweep
from raymm.app.sweep_plan import actions_of, plan_jobs
from raymm.errors import RaymmError, ScenarioError

from helpers import tiny_scenario


def tiny_file(folder: Path, **overrides) -> Path:
    path = folder / "tiny.yaml"
    path.write_text(yaml.safe_dump(tiny_scenario(**{
        "rounds": 2, "eval.every": 2, "output.checkpoint_every": 1, **overrides})))
    return path


def test_grid_times_methods_times_seeds(tmp_path):
    jobs = plan_jobs([tiny_file(tmp_path)], [0, 1], [], tmp_path / "runs",
                     methods=["fedavg", "fedprox"], grid=["training.lr=0.01,0.1"])
    names = [j.run_dir.name for j in jobs]
    assert names == ["tiny_lr0.01-seed0", "tiny_lr0.01-seed1", "tiny_fedprox_lr0.01-seed0",
                     "tiny_fedprox_lr0.01-seed1", "tiny_lr0.1-seed0", "tiny_lr0.1-seed1",
                     "tiny_fedprox_lr0.1-seed0", "tiny_fedprox_lr0.1-seed1"]
    assert [j.scenario.training.lr for j in jobs] == [0.01] * 4 + [0.1] * 4
    assert {j.scenario.method for j in jobs} == {"fedavg", "fedprox"}


def test_a_grid_value_the_schema_refuses_names_the_key(tmp_path):
    with pytest.raises(ScenarioError, match="selection.k"):
        plan_jobs([tiny_file(tmp_path)], [], [], tmp_path / "runs", grid=["selection.k=5,-1"])


def test_values_that_only_differ_in_unsafe_characters_are_refused(tmp_path):
    with pytest.raises(ScenarioError, match="would share"):
        plan_jobs([tiny_file(tmp_path)], [], [], tmp_path / "runs",
                  grid=["description=a b,a/b"])


def test_a_grid_sweep_skips_continues_and_refuses_like_a_seed_sweep(tmp_path, capsys):
    scenario, out = tiny_file(tmp_path), tmp_path / "sw"
    grid = ["training.lr=0.01,0.1", "selection.k=3,5"]
    comp = run_sweep([scenario], [1], out=out, grid=grid)
    assert not comp.failed and len(comp.runs) == 4
    runs = out / "runs"
    assert sorted(p.name for p in runs.iterdir()) == [
        f"tiny_lr{lr}_k{k}-seed1" for lr in ("0.01", "0.1") for k in (3, 5)]
    saved = yaml.safe_load((runs / "tiny_lr0.1_k3-seed1" / "config.yaml").read_text())
    assert saved["training"]["lr"] == 0.1 and saved["selection"]["k"] == 3
    # one run interrupted after round 1 (its checkpoint kept), one deleted: the same command
    # skips two, continues one and runs one again, and ends with the same numbers
    cut = runs / "tiny_lr0.01_k5-seed1"
    before = json.loads((cut / "summary.json").read_text())["final_accuracy"]
    (cut / "summary.json").unlink()
    shutil.rmtree(runs / "tiny_lr0.1_k5-seed1")
    capsys.readouterr()
    comp = run_sweep([scenario], [1], out=out, grid=grid)
    said = capsys.readouterr().out
    assert said.count("raymm sweep: skipping") == 2
    assert "resuming tiny_lr0.01_k5 seed 1 from its checkpoint" in said
    assert len(comp.runs) == 4 and not comp.failed
    assert json.loads((cut / "summary.json").read_text())["final_accuracy"] == before
    # a changed setting under an existing name is another configuration: refused
    with pytest.raises(RaymmError, match="another configuration"):
        actions_of(plan_jobs([scenario], [1], ["training.batch_size=8"], runs, grid=grid))
