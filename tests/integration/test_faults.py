"""Injected faults: the run completes, failures are recorded, results are reproducible."""

import numpy as np
import pandas as pd
import pytest

from raymm.app.api import run
from raymm.app.build import load_scenario
from raymm.config.schema import FaultSpec
from raymm.population.faults import device_crashes, host_kills

from helpers import tiny_scenario

FAULTS = {"actor_kill_prob": 0.25, "device_crash_prob": 0.2, "deadline_seconds": None, "seed": 5}


def scenario(executor, eval_every=1, server="actor", **faults):
    return load_scenario(tiny_scenario(**{
        "rounds": 5, "execution.executor": executor, "execution.devices_per_actor": 6,
        "execution.server": server,
        "model.adapter": True, "objective": {"name": "ce", "adapter": True},
        "eval.every": eval_every, "faults": {**FAULTS, **faults}}))


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
@pytest.mark.parametrize("eval_every,server", [(1, "actor"), (5, "actor"), (5, "driver")],
                         ids=["plan-each-round", "plan-ahead", "server-in-driver"])
def test_actor_kills_on_ray_match_serial(tmp_path, ray_session, eval_every, server):
    """A killed DeviceActor is restarted by Ray and gets its devices' state back, so the run
    equals the serial run with the same fault seed, bit for bit; also when the server plans
    rounds 2-5 ahead (no evaluation before round 5), a plan made from a killed actor's report
    then never running; and with the server in the driver (a failed input makes its call's
    reference fail as an actor task's would)."""
    ser = run(scenario("serial", eval_every), out=tmp_path / "s")
    ray_run = run(scenario("ray", eval_every, server), out=tmp_path / "r")
    rows_s = pd.read_parquet(ser.run_dir / "rounds.parquet").drop(columns=["wall_seconds"])
    rows_r = pd.read_parquet(ray_run.run_dir / "rounds.parquet").drop(columns=["wall_seconds"])
    assert rows_r["actors_killed"].sum() > 0
    pd.testing.assert_frame_equal(rows_s, rows_r, check_exact=True)
    for g in ser.params:
        assert np.array_equal(ser.params[g], ray_run.params[g])


@pytest.mark.ray
@pytest.mark.slow
def test_actor_crash_between_rounds_is_seen_and_repaired(tmp_path, ray_session):
    """An actor that crashes while idle is restarted by Ray without its devices' state; it
    refuses to work until the executor gives the state back, so the crash costs its devices
    one round (lost or offline) and never lets them silently start over."""
    import os
    import signal

    import ray

    from actors.ray_executor import RayExecutor
    from raymm.app.build import build_world, load_scenario
    from raymm.sim.engine import run_round

    raw = tiny_scenario(**{"method": "tide", "rounds": 4, "selection.k": 8,
                           "execution.executor": "ray", "execution.devices_per_actor": 6,
                           "execution.actor": {"num_cpus": 0.1, "max_restarts": 2}})
    sc = load_scenario(raw)
    serial = pd.read_parquet(run(load_scenario({**raw, "execution": {"executor": "serial"}}),
                                 out=tmp_path).run_dir / "rounds.parquet")
    ex = RayExecutor(sc.execution)
    ex.start(build_world(sc))
    try:
        rows = [run_round(ex, t, sc).row for t in (1, 2)]
        kept = {d: v for d, v in ex.vault.items() if d in set(ex.blocks[0].tolist())}
        assert kept, "the victim's devices should hold adapters by now"
        ray.get([r for refs in ex._reports.values() for r in refs])  # round 3's, asked early
        os.kill(ray.get(ex.actors[0].__ray_call__.remote(lambda _: os.getpid())), signal.SIGKILL)
        wait_until_restarted(ex.actors[0])
        rows += [run_round(ex, t, sc).row for t in (3, 4)]
        state = ray.get(ex.actors[0].state_dict.remote())
    finally:
        ex.shutdown()
    hit = [r["actors_killed"] > 0 or r["online"] < serial["online"].iloc[r["round"] - 1]
           for r in rows[2:]]
    assert any(hit), rows[2:]
    assert set(state) == {d for d in ex.vault if d in set(ex.blocks[0].tolist())}
    for d, v in state.items():
        assert np.array_equal(np.asarray(v), np.asarray(ex.vault[d]))


def wait_until_restarted(actor, timeout_s: float = 60.0) -> None:
    import time

    import ray
    from ray.exceptions import RayError

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            ray.get(actor.placement.remote(), timeout=timeout_s)
            return
        except RayError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


@pytest.mark.ray
def test_a_revived_actor_whose_setup_was_lost_is_set_up_again(ray_session):
    """While Ray restarts an actor, the `setup` sent to it can be lost while the
    `load_state_dict` behind it reaches the restarted actor, which has no host yet: the driver
    sets it up again and loads the state into that same actor (it used to give up on it and
    start another, which on a small cluster waited for the CPUs the old one still held)."""
    from actors.device_actor import NoHostYet
    from actors.ray_executor import RayExecutor

    @ray_session.remote(num_cpus=0)
    class LostFirstSetup:
        def __init__(self) -> None:
            self.setups, self.host, self.state = 0, None, None

        def setup(self, *shared) -> None:
            self.setups += 1
            if self.setups > 1:   # the first one never arrived
                self.host = "built"

        def load_state_dict(self, state) -> None:
            if self.host is None:
                raise NoHostYet("no host yet")
            self.state = state

        def seen(self):
            return self.setups, self.host, self.state

    ex = RayExecutor.__new__(RayExecutor)   # just what reviving reads
    actor = LostFirstSetup.remote()
    ex.actors, ex._shared = [actor], ()
    ex.blocks, ex.vault = [np.array([3, 4])], {3: "kept by 3", 9: "someone else's"}
    ex._revive(0)
    assert ex.actors[0] is actor
    assert ray_session.get(actor.seen.remote()) == (2, "built", {3: "kept by 3"})
    ray_session.kill(actor)
