"""Checkpoint/resume: a resumed run ends exactly where an uninterrupted one does."""

import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pytest
import yaml

from raymm.app.api import run
from raymm.app.cli import main
from raymm.driver.checkpoint import load
from raymm.errors import Interrupted

from helpers import REPO, resume_from_round_3, tiny_scenario


def scenario(executor="serial", **kw):
    return tiny_scenario(**{"rounds": 7, "eval.every": 2, "output.checkpoint_every": 3,
                            "model.adapter": True, "objective": {"name": "ce", "adapter": True},
                            "execution.executor": executor, "execution.devices_per_actor": 6,
                            **kw})


def table(run_dir):
    return pd.read_parquet(run_dir / "rounds.parquet").drop(columns=["wall_seconds"])


def assert_same_run(a_dir, a_params, b_dir, b_params):
    for g in a_params:
        assert np.array_equal(a_params[g], b_params[g]), g
    pd.testing.assert_frame_equal(table(a_dir), table(b_dir), check_exact=True)


def test_resume_serial_is_exact(tmp_path):
    ref = run(scenario(), out=tmp_path)
    ck = load(ref.run_dir)
    assert ck.round == 6 and len(ck.rows) == 6 and ck.hosts  # adapters persisted per device
    res = resume_from_round_3(tmp_path, ref)
    assert res.summary["rounds_completed"] == 7
    assert_same_run(ref.run_dir, ref.params, res.run_dir, res.params)


@pytest.mark.ray
def test_resume_ray_is_exact(tmp_path, ray_session):
    ref = run(scenario("serial"), out=tmp_path)
    res_ray = run(scenario("ray"), out=tmp_path / "ray")
    assert_same_run(ref.run_dir, ref.params, res_ray.run_dir, res_ray.params)
    res = resume_from_round_3(tmp_path, res_ray)
    assert_same_run(ref.run_dir, ref.params, res.run_dir, res.params)


@pytest.mark.ray
def test_interrupt_after_a_round_whose_successor_was_planned_ahead(tmp_path, ray_session):
    """On Ray the server plans round 4 while round 3's statistics travel to the driver. Ctrl-C
    in round 3 leaves that plan in the checkpoint; resumed on Ray or serially, round 4 trains
    that plan and the run ends as an uninterrupted one does. Least-selected-first selection
    counts selections as it plans: planning round 4 twice would pick other devices."""
    fair = {"output.checkpoint_every": 0, "selection": {"name": "least_selected", "k": 5}}
    ref = run(scenario(**fair), out=tmp_path / "ref")

    def ctrl_c_in_round_3(row):
        if row["round"] == 3:
            os.kill(os.getpid(), signal.SIGINT)

    def interrupted(**kw):
        with pytest.raises(Interrupted) as stop:
            run(scenario("ray", **fair, **kw), out=tmp_path / "cut", on_round=ctrl_c_in_round_3)
        assert stop.value.last_round == 3
        return load(stop.value.run_dir), stop.value.run_dir

    ck, cut = interrupted()
    assert ck.round == 3 and ck.server["planned"]["plan"]["round"] == 4
    for executor in ("ray", "serial"):
        copy = tmp_path / executor
        shutil.copytree(cut, copy)
        res = run(resume=copy, executor=executor)
        assert_same_run(ref.run_dir, ref.params, res.run_dir, res.params)
    # switched off, the round-3 checkpoint holds no plan
    assert "planned" not in interrupted(**{"execution.plan_ahead": False})[0].server


def test_resume_rejects_other_scenarios_and_non_runs(tmp_path, capsys):
    ref = run(scenario(), out=tmp_path)
    p = tmp_path / "other.yaml"
    p.write_text(yaml.safe_dump(scenario(seed=99)))
    before = sorted(x.name for x in ref.run_dir.rglob("*"))
    assert main(["run", str(p), "--resume", str(ref.run_dir)]) == 2
    assert "run of another scenario" in capsys.readouterr().err
    assert main(["run", "--resume", str(tmp_path)]) == 2
    assert "not a raymm run directory" in capsys.readouterr().err
    assert main(["run", "--resume", str(tmp_path / "nope")]) == 2
    assert "not a directory" in capsys.readouterr().err
    ckpts = ref.run_dir / "checkpoints"
    kept = (ckpts / "round-000003.safetensors").read_bytes()
    (ckpts / "round-000006.safetensors").write_bytes(b"garbage")
    (ckpts / "round-000003.safetensors").write_bytes(kept[:-10])
    assert main(["run", "--resume", str(ref.run_dir)]) == 2
    err = capsys.readouterr().err
    assert "no checkpoint in" in err and "verifies" in err and "round-000003" in err
    (ckpts / "round-000003.safetensors").write_bytes(kept)
    assert sorted(x.name for x in ref.run_dir.rglob("*")) == before  # nothing overwritten
    # execution and output may differ on resume
    (ref.run_dir / "checkpoints" / "round-000006.safetensors").unlink()
    ok = run(scenario(), ["execution.devices_per_actor=2"], resume=ref.run_dir)
    assert ok.summary["rounds_completed"] == 7


def _spawn(path, out):
    env = dict(os.environ, RAYMM_NO_PROGRESS="1", PYTHONPATH=str(REPO))
    return subprocess.Popen([sys.executable, "-m", "raymm.app.cli", "run", str(path), "--out",
                             str(out)], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _wait_for_checkpoint(out, proc, timeout=120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = list(out.glob("*/checkpoints/round-*.safetensors"))
        if found:
            return found[0].parent.parent
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    raise AssertionError("no checkpoint appeared")


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT])
def test_driver_killed_or_interrupted_then_resumed(tmp_path, sig):
    raw = scenario(rounds=40, **{"output.checkpoint_every": 2})
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(raw))
    ref = run(raw, out=tmp_path / "ref")
    proc = _spawn(path, tmp_path / "killed")
    run_dir = _wait_for_checkpoint(tmp_path / "killed", proc)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    if sig == signal.SIGINT:
        assert proc.returncode == 130, err
        assert f"Resume with: raymm run --resume {run_dir}" in err
        assert "Traceback" not in err
    else:
        assert proc.returncode == -signal.SIGKILL
    done = load(run_dir).round
    assert 2 <= done <= 40
    res = run(resume=run_dir)
    assert_same_run(ref.run_dir, ref.params, res.run_dir, res.params)


def test_resume_tide_with_prototypes_and_adapters(tmp_path):
    """TIDE keeps server prototypes (aggregator state) and per-device adapters (device state):
    both must come back exactly."""
    raw = tiny_scenario(method="tide", rounds=7, **{
        "eval.every": 2, "output.checkpoint_every": 3, "selection": {"name": "tide", "k": 5},
        "aggregation": {"name": "tide", "warmup": 2},
        # the adapters also predict: per-device evaluation next to the pooled one
        "population.local_test_fraction": 0.25, "eval.scope": "both"})
    ref = run(raw, out=tmp_path)
    ck = load(ref.run_dir)
    assert ck.hosts and ck.server["aggregator"]["prototypes"] is not None
    assert table(ref.run_dir)["personal_accuracy"].notna().sum() == 4
    res = resume_from_round_3(tmp_path, ref)
    assert_same_run(ref.run_dir, ref.params, res.run_dir, res.params)


def test_resume_fedmchain_with_cluster_models_and_kept_parameters(tmp_path):
    """FedMChain keeps SSCA cluster models on the server and, between syncs, each device's own
    parameters and cluster index on the device: a resumed run must end exactly the same."""
    settings = ["rounds=7", "training.sync_every=2", "eval.every=3",
                "output.checkpoint_every=3", "output.tensorboard=false"]
    ref = run(REPO / "scenarios" / "fedmchain_synthetic.yaml", settings, out=tmp_path,
              executor="serial")
    ck = load(ref.run_dir)
    assert any(isinstance(v, dict) for v in ck.hosts.values())  # kept parameters per device
    res = resume_from_round_3(tmp_path, ref)
    assert_same_run(ref.run_dir, ref.params, res.run_dir, res.params)


def test_resume_scaffold_with_control_variates(tmp_path):
    """SCAFFOLD keeps the server's control variate c (aggregator state) and each device's c_i
    (device state): both come back exactly through the data-only checkpoint."""
    raw = tiny_scenario(method="scaffold", rounds=7, **{
        "eval.every": 2, "output.checkpoint_every": 3})
    ref = run(raw, out=tmp_path)
    ck = load(ref.run_dir)
    assert ck.server["aggregator"]["c"] and ck.hosts
    assert all(isinstance(v, dict) for v in ck.hosts.values())  # c_i per device
    res = resume_from_round_3(tmp_path, ref)
    assert_same_run(ref.run_dir, ref.params, res.run_dir, res.params)
