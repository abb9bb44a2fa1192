"""`raymm sweep --grid`: the product of any settings with methods and seeds, readable safe run
names, and the same skip / continue / refuse behaviour as a seed sweep."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from raymm.app.grid import grid_name, grid_points, parse_grid, split_values
from raymm.app.sweep import run_sweep
from raymm.app.sweep_plan import actions_of, plan_jobs
from raymm.errors import RaymmError, ScenarioError
from raymm.io.paths import name_problems

from helpers import tiny_scenario


def tiny_file(folder: Path, **overrides) -> Path:
    path = folder / "tiny.yaml"
    path.write_text(yaml.safe_dump(tiny_scenario(**{
        "rounds": 2, "eval.every": 2, "output.checkpoint_every": 1, **overrides})))
    return path


def test_values_split_outside_brackets_and_quotes():
    assert split_values("1e-3,1e-2") == ["1e-3", "1e-2"]
    assert split_values("[32,32],[64]") == ["[32,32]", "[64]"]
    assert split_values("{a: 1, b: 2},'x,y'") == ["{a: 1, b: 2}", "'x,y'"]
    assert parse_grid("training.lr=1e-3, 1e-2").values == ("1e-3", "1e-2")


@pytest.mark.parametrize("bad, says", [
    ("training.lr", "expected key.path=value1"), ("=1,2", "expected key.path"),
    ("training.lr=1,,2", "empty value"), ("seed=1,2", "use --seeds"),
    ("name=a,b", "not a grid key"), ("training.lr=1,1", "given twice")])
def test_malformed_grids_are_refused(bad, says):
    with pytest.raises(ScenarioError, match=says):
        grid_points([bad])


def test_points_are_the_product_with_readable_safe_names():
    points = grid_points(["training.lr=1e-3,1e-2", "selection.k=10,20"])
    assert [p.suffix for p in points] == ["_lr1e-3_k10", "_lr1e-3_k20", "_lr1e-2_k10",
                                          "_lr1e-2_k20"]
    assert points[1].overrides == ("training.lr=1e-3", "selection.k=20")
    # two keys with one last part: the whole path names them; unsafe characters become '-'
    odd = grid_points(["model.hidden=[32, 32]", "training.hidden=a/b"])
    assert odd[0].suffix == "_model-hidden32-32_training-hiddena-b"
    long = grid_name("x" * 80, grid_points(["training.lr=" + "1" * 40])[0])
    assert len(long) <= 88 and not name_problems(long) and long.startswith("x" * 70)
    assert grid_points([]) == [grid_points([])[0]] and grid_points([])[0].suffix == ""


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
