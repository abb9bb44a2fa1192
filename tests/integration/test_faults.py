"""Injected faults: the run completes, failures are recorded, results are reproducible."""

import numpy as np
import pandas as pd
import pytest

from raymm.api import load_scenario, run
from raymm.config import FaultSpec
from raymm.faults import device_crashes, host_kills

from helpers import tiny_scenario

FAULTS = {"actor_kill_prob": 0.25, "device_crash_prob": 0.2, "deadline_seconds": None, "seed": 5}


def scenario(executor, **faults):
    return load_scenario(tiny_scenario(**{
        "rounds": 5, "execution.executor": executor, "execution.devices_per_actor": 6,
        "model.adapter": True, "objective": {"name": "ce", "adapter": True},
        "faults": {**FAULTS, **faults}}))


def test_fault_injection_serial_is_recorded_and_reproducible(tmp_path):
    sc = scenario("serial")
    a = run(sc, out=tmp_path / "a")
    b = run(sc, out=tmp_path / "b")
    for g in a.params:
        assert np.array_equal(a.params[g], b.params[g])
    rows = pd.read_parquet(a.run_dir / "rounds.parquet")
    assert rows["round"].tolist() == [1, 2, 3, 4, 5]  # the run completed
    spec = sc.faults
    assert rows["actors_killed"].sum() > 0 and rows["failed"].sum() > 0
    for _, r in rows.iterrows():
        t = int(r["round"])
        kills = host_kills(spec, spec.seed, t, 2)
        assert r["participated"] + r["failed"] + r["lost"] == r["selected"]
        assert r["actors_killed"] <= kills.sum()
        assert (r["lost"] > 0) == (r["actors_killed"] > 0)
    clean = run(scenario("serial", actor_kill_prob=0.0, device_crash_prob=0.0), out=tmp_path)
    assert not np.array_equal(clean.params["shared"], a.params["shared"])
    assert clean.rows[-1]["failed"] == 0


def test_crash_decisions_are_pure_functions():
    spec = FaultSpec(device_crash_prob=0.5, actor_kill_prob=0.5)
    ids = np.arange(200)
    a, b = device_crashes(spec, 1, 3, ids), device_crashes(spec, 1, 3, ids)
    assert np.array_equal(a, b) and 60 < a.sum() < 140
    assert not np.array_equal(a, device_crashes(spec, 1, 4, ids))
    assert device_crashes(FaultSpec(), 1, 3, ids).sum() == 0
    assert np.array_equal(host_kills(spec, 2, 7, 5), host_kills(spec, 2, 7, 5))


def test_stragglers_miss_the_deadline(tmp_path):
    base = run(scenario("serial", actor_kill_prob=0.0, device_crash_prob=0.0), out=tmp_path)
    times = pd.read_parquet(base.run_dir / "rounds.parquet")["sim_seconds"]
    deadline = float(times.median()) * 0.999
    res = run(scenario("serial", actor_kill_prob=0.0, device_crash_prob=0.0,
                       deadline_seconds=deadline), out=tmp_path)
    rows = pd.read_parquet(res.run_dir / "rounds.parquet")
    assert rows["stragglers"].sum() > 0
    assert (rows["sim_seconds"] <= deadline + 1e-12).all()
    assert (rows["participated"] + rows["stragglers"] == rows["selected"]).all()


@pytest.mark.ray
@pytest.mark.slow
def test_actor_kills_on_ray_match_serial(tmp_path, ray_session):
    """A killed DeviceActor is restarted by Ray and gets its devices' state back, so the run
    equals the serial run with the same fault seed, bit for bit."""
    ser = run(scenario("serial"), out=tmp_path / "s")
    ray_run = run(scenario("ray"), out=tmp_path / "r")
    rows_s = pd.read_parquet(ser.run_dir / "rounds.parquet").drop(columns=["wall_seconds"])
    rows_r = pd.read_parquet(ray_run.run_dir / "rounds.parquet").drop(columns=["wall_seconds"])
    assert rows_r["actors_killed"].sum() > 0
    pd.testing.assert_frame_equal(rows_s, rows_r, check_exact=True)
    for g in ser.params:
        assert np.array_equal(ser.params[g], ray_run.params[g])
