"""`raymm sweep` (raymm.app.sweep) for long sweeps: `--jobs N` runs in processes of their own
with the same results, a re-run skips finished runs and continues interrupted ones, a failing
run is reported while the others finish, a directory of another configuration is refused;
and `--methods` runs every method on a scenario."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import signal
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from safetensors.numpy import load_file

import raymm.app.api
from raymm.app.api import run
from raymm.app.cli import main
from raymm.app.sweep import run_sweep
from raymm.errors import Interrupted, RaymmError, ScenarioError

from helpers import tiny_scenario

SEEDS = (1, 2)
WALL = ("wall_seconds", "wall_seconds_per_round")


def tiny_file(folder: Path, **overrides) -> Path:
    """4 rounds, evaluated and checkpointed every 2: a run that can stop and resume."""
    path = folder / f"{overrides.get('name', 'tiny')}.yaml"
    path.write_text(yaml.safe_dump(tiny_scenario(**{
        "rounds": 4, "eval.every": 2, "output.checkpoint_every": 2, **overrides})))
    return path


def sweep(*args: str) -> tuple[int, str, str]:
    """`raymm sweep ...` in this process: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["sweep", *args])
    return code, out.getvalue(), err.getvalue()


def rounds(run_dir: Path) -> pd.DataFrame:
    return pd.read_parquet(run_dir / "rounds.parquet").drop(columns=["wall_seconds"])


def summary(run_dir: Path) -> dict:
    s = json.loads((run_dir / "summary.json").read_text())
    return {k: v for k, v in s.items() if k not in WALL}


def assert_same_run(a: Path, b: Path) -> None:
    pd.testing.assert_frame_equal(rounds(a), rounds(b))
    assert summary(a) == summary(b)
    ta, tb = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    assert ta.keys() == tb.keys()
    assert all(np.array_equal(ta[k], tb[k]) for k in ta)


@pytest.fixture(scope="module")
def one_by_one(tmp_path_factory) -> Path:
    """The reference: `tiny` for two seeds, one after the other in this process (--jobs 1)."""
    folder = tmp_path_factory.mktemp("serial")
    code, _, err = sweep(str(tiny_file(folder)), "--seeds", *map(str, SEEDS),
                         "--out", str(folder / "sw"))
    assert code == 0, err
    return folder / "sw"


@pytest.fixture(scope="module")
def parallel(tmp_path_factory) -> tuple[Path, int, str, str]:
    """`tiny` and `bad` (a learning rate that passes validation and diverges in round 1) for
    two seeds, two runs at a time, B from `bad`'s runs: (sweep folder, exit code, stdout,
    stderr)."""
    folder = tmp_path_factory.mktemp("parallel")
    bad = tiny_file(folder, name="bad", **{"training.lr": 1e30})
    code, out, err = sweep(str(tiny_file(folder)), str(bad), "--seeds", *map(str, SEEDS),
                           "--jobs", "2", "--budget-from", "bad", "--out", str(folder / "sw"))
    return folder / "sw", code, out, err


def test_two_jobs_at_once_give_the_runs_of_one_at_a_time(one_by_one, parallel) -> None:
    sw, _, out, _ = parallel
    for seed in SEEDS:
        assert_same_run(one_by_one / "runs" / f"tiny-seed{seed}", sw / "runs" / f"tiny-seed{seed}")
        # each child's output went to its log, next to its directory
        assert "tiny: 4 rounds" in (sw / "runs" / f"tiny-seed{seed}.log").read_text()
        assert f"tiny seed {seed}: final accuracy 0." in out
    # the seeds differ (the comparison above is not between two copies of one number)
    losses = [rounds(one_by_one / "runs" / f"tiny-seed{s}")["train_loss"].tolist() for s in SEEDS]
    assert losses[0] != losses[1]
    assert not list((one_by_one / "runs").glob("*.log"))   # --jobs 1 runs in this process


def test_a_failing_run_is_reported_and_the_others_finish(parallel) -> None:
    sw, code, _, err = parallel
    assert code == 1
    for seed in SEEDS:
        log = sw / "runs" / f"bad-seed{seed}.log"
        assert f"bad seed {seed} FAILED" in err and f"log: {log}" in err
        assert "training diverged" in log.read_text()
    # the table of the runs that finished, without the B that only the failed ones could give
    assert "--budget-from bad: none of its runs finished, so the table has no Acc@B" in err
    table = pd.read_parquet(sw / "comparison.parquet")
    assert sorted(table["run_dir"]) == [str(sw / "runs" / f"tiny-seed{s}") for s in SEEDS]
    md = (sw / "comparison.md").read_text()
    assert md.startswith("B not set") and "| tiny | 2 |" in md


def test_a_diverged_run_is_reported_again_not_rerun(parallel, monkeypatch) -> None:
    sw = parallel[0]
    monkeypatch.setattr(raymm.app.api, "run", lambda *a, **k: pytest.fail("a run was started"))
    comp = run_sweep([sw.parent / "bad.yaml"], SEEDS, out=sw)
    assert not comp.runs
    assert comp.failed == [f"bad seed {s}: diverged in an earlier sweep ({sw / 'runs'}"
                           f"/bad-seed{s}); not run again, it would diverge the same way"
                           for s in SEEDS]


def test_a_failing_run_in_this_process_does_not_stop_the_next(tmp_path, monkeypatch,
                                                              capsys) -> None:
    real = raymm.app.api.run

    def flaky(scenario, *args, **kwargs):
        if scenario.seed == 1:
            raise RuntimeError("disk on fire")
        return real(scenario, *args, **kwargs)

    monkeypatch.setattr(raymm.app.api, "run", flaky)
    comp = run_sweep([tiny_file(tmp_path)], SEEDS, out=tmp_path / "sw")
    assert [r["seed"] for r in comp.runs] == [2]
    assert comp.failed == ["tiny seed 1: RuntimeError: disk on fire"]
    assert "tiny seed 1 FAILED" in capsys.readouterr().err


def test_a_second_sweep_skips_finished_runs(one_by_one, tmp_path, monkeypatch, capsys) -> None:
    def no_run(*args, **kwargs):
        raise AssertionError("a finished run was run again")

    monkeypatch.setattr(raymm.app.api, "run", no_run)
    before = sorted(p.name for p in (one_by_one / "runs").iterdir())
    comp = run_sweep([tiny_file(tmp_path)], SEEDS, out=one_by_one)
    assert sorted(p.name for p in (one_by_one / "runs").iterdir()) == before
    assert [r["seed"] for r in comp.runs] == list(SEEDS) and not comp.failed
    out = capsys.readouterr().out
    assert all(f"skipping tiny seed {s}: finished" in out for s in SEEDS)


def test_an_interrupted_run_resumes_and_ends_as_an_uninterrupted_one(one_by_one, tmp_path,
                                                                     capsys) -> None:
    path = tiny_file(tmp_path)
    run_dir = tmp_path / "sw" / "runs" / "tiny-seed1"

    def ctrl_c_in_round_2(row):
        if row["round"] == 2:
            signal.raise_signal(signal.SIGINT)   # what the terminal's Ctrl-C does

    with pytest.raises(Interrupted):
        run(path, ["seed=1"], run_dir=run_dir, on_round=ctrl_c_in_round_2)
    assert json.loads((run_dir / "summary.json").read_text())["ended"] == "interrupted"
    assert len(rounds(run_dir)) == 2
    comp = run_sweep([path], [1], out=tmp_path / "sw")
    assert "resuming tiny seed 1 from its checkpoint" in capsys.readouterr().out
    assert not comp.failed
    assert_same_run(one_by_one / "runs" / "tiny-seed1", run_dir)


def test_killed_runs_continue_in_child_processes(one_by_one, tmp_path, capsys) -> None:
    """seed 1 killed after its round-2 checkpoint (no summary): resumed; seed 2 killed before
    any checkpoint (only its config): started over. Both end as the uninterrupted runs."""
    runs = tmp_path / "sw" / "runs"
    killed = shutil.copytree(one_by_one / "runs" / "tiny-seed1", runs / "tiny-seed1")
    (killed / "summary.json").unlink()
    (killed / "checkpoints" / "round-000004.safetensors").unlink()
    (runs / "tiny-seed2").mkdir()
    shutil.copy(one_by_one / "runs" / "tiny-seed2" / "config.yaml", runs / "tiny-seed2")
    comp = run_sweep([tiny_file(tmp_path)], SEEDS, out=tmp_path / "sw", jobs=2)
    out = capsys.readouterr().out
    assert "resuming tiny seed 1" in out and "restarting tiny seed 2" in out
    assert not comp.failed
    for seed in SEEDS:
        assert_same_run(one_by_one / "runs" / f"tiny-seed{seed}", runs / f"tiny-seed{seed}")


def test_a_directory_of_another_configuration_is_refused(one_by_one, tmp_path) -> None:
    mtimes = {p: p.stat().st_mtime_ns for p in one_by_one.rglob("*")}
    with pytest.raises(RaymmError) as err:
        run_sweep([tiny_file(tmp_path)], SEEDS, ["rounds=5"], out=one_by_one)
    for seed in SEEDS:   # every such directory named at once
        assert f"{one_by_one / 'runs' / f'tiny-seed{seed}'} holds a run of another " \
               "configuration" in str(err.value)
    assert {p: p.stat().st_mtime_ns for p in one_by_one.rglob("*")} == mtimes
    code, _, stderr = sweep(str(tiny_file(tmp_path)), "--seeds", "1", "--set", "rounds=5",
                            "--out", str(one_by_one))
    assert code == 2 and "another configuration" in stderr


def test_a_folder_holding_only_a_cut_short_write_is_restarted(tmp_path, capsys) -> None:
    """A sweep killed while it wrote a run's first file leaves only the hidden temp file of that
    write: the next sweep clears the folder and runs the job, not refuses it."""
    run_dir = tmp_path / "sw" / "runs" / "tiny-seed1"
    run_dir.mkdir(parents=True)
    (run_dir / ".config.yaml.x1y2.part").write_text("name: ti")
    comp = run_sweep([tiny_file(tmp_path)], [1], out=tmp_path / "sw")
    assert not comp.failed
    assert "restarting tiny seed 1" in capsys.readouterr().out
    assert sorted(p.name for p in run_dir.iterdir() if p.name.startswith(".")) == []
    assert (run_dir / "summary.json").is_file()


def test_bad_input_is_refused_before_any_run(tmp_path) -> None:
    (tmp_path / "sw" / "runs" / "tiny-seed1").mkdir(parents=True)
    (tmp_path / "sw" / "runs" / "tiny-seed1" / "notes.txt").write_text("mine")
    with pytest.raises(RaymmError, match="not a run directory"):
        run_sweep([tiny_file(tmp_path)], [1], out=tmp_path / "sw")
    other = tmp_path / "other"
    other.mkdir()
    with pytest.raises(ScenarioError, match="would share"):   # same name, same seed
        run_sweep([tiny_file(tmp_path), tiny_file(other, rounds=5)], [3], out=tmp_path / "s2")
    code, _, err = sweep(str(tiny_file(tmp_path)), "--jobs", "0", "--out", str(tmp_path / "s3"))
    assert code == 2 and "--jobs must be at least 1" in err
    code, _, err = sweep(str(tiny_file(tmp_path)), "--budget-from", "tiny_fedavg",
                         "--out", str(tmp_path / "s3"))
    assert code == 2 and "--budget-from: no job runs scenario 'tiny_fedavg'" in err
    assert not (tmp_path / "s2").exists() and not (tmp_path / "s3").exists()
    with pytest.raises(RaymmError, match="not empty"):
        run(tiny_file(tmp_path), run_dir=tmp_path / "sw" / "runs" / "tiny-seed1")


def test_sweep_cli_runs_every_method_on_a_scenario(tmp_path: Path, capsys) -> None:
    import yaml

    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(tiny_scenario(**{"rounds": 2, "eval.every": 1})))
    out = tmp_path / "sweep"
    code = main(["sweep", str(path), "--methods", "fedavg", "fedadam", "harmony",
                 "--seeds", "1", "2", "--out", str(out), "--budget-from", "tiny"])
    assert code == 0
    table = (out / "comparison.md").read_text()
    for name in ("| tiny | 2 |", "| tiny_fedadam | 2 |", "| tiny_harmony | 2 |"):
        assert name in table
    assert len(list((out / "runs").iterdir())) == 6
