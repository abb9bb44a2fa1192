"""The synchronous round on the simulated clock (`clock.mode: seconds`, raymm.server.clock) in
whole runs: over-commitment, departures, idle time, evaluation every T simulated seconds,
exact resume, the time axis of compare and TensorBoard; and the round clock reading a trace at
slot instants. How a round ends, as pure numpy: population/test_clock.py."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from raymm.app.api import run
from raymm.population.traces import build_trace, write_raymm

from helpers import resume_from_round_3, tiny_scenario

HW = [{"name": "x", "fraction": 1.0, "gflops": 5e-7, "up_mbps": 1, "down_mbps": 1,
       "jitter": 0.5}]
ROWS = [[(0, 300), (600, 900)], [(100, 1000)], [(0, 50), (60, 2000)], [(500, 700)]]


def clock_run(tmp_path, name="c", **extra):
    trace = tmp_path / "trace.csv"
    if not trace.exists():
        write_raymm(build_trace(["a", "b", "c", "d"], ROWS, [(0, 1000)] * 4), trace)
    sc = tiny_scenario(**{"rounds": 8, "population.trace": {"path": str(trace)},
                          "population.hardware": HW, "selection": {"name": "random", "k": 3},
                          "clock": {"mode": "seconds"}, "name": name, **extra})
    res = run(sc, out=tmp_path / "runs")
    return res, pd.read_parquet(res.run_dir / "rounds.parquet")


def test_seconds_clock_rounds(tmp_path):
    res, df = clock_run(tmp_path)
    # the clock: each round starts where the previous ended (plus idle time)
    np.testing.assert_allclose(df["sim_start_seconds"].iloc[1:].to_numpy(),
                               df["sim_seconds_total"].iloc[:-1].to_numpy()
                               + df["idle_seconds"].iloc[1:].to_numpy())
    np.testing.assert_allclose(df["sim_seconds_total"], (df["sim_seconds"]
                                                         + df["idle_seconds"]).cumsum())
    assert df["departed"].sum() > 0
    # a departed device counts as selected, not as participating
    assert (df["participated"] + df["departed"] + df["stragglers"] <= df["selected"]).all()
    assert (df["wasted_seconds"] <= df["work_seconds"] + 1e-9).all()
    s = res.summary
    assert s["departed"] == int(df["departed"].sum())
    assert 0 < s["wasted_work_share"] < 1
    assert s["wasted_work_share"] == pytest.approx(df["wasted_seconds"].sum()
                                                   / df["work_seconds"].sum())
    assert len(s["accuracy_vs_sim_hours"]) == int(df["accuracy"].notna().sum())
    # every device's trace entry is in devices.parquet (times traceable to an entry)
    devices = pd.read_parquet(res.run_dir / "devices.parquet")
    assert set(devices["trace_entry"]) <= {"a", "b", "c", "d"}


def test_kth_with_overcommit_keeps_k(tmp_path):
    _, df = clock_run(tmp_path, clock={"mode": "seconds", "round_end": "kth",
                                       "overcommit": 0.5})
    assert df["selected"].max() == 5  # ceil(3 * 1.5)
    assert (df["participated"] <= 3).all()
    full = df[df["participated"] == 3]
    assert len(full) and (full["stragglers"] + full["departed"] == full["selected"] - 3).all()


def test_idle_until_someone_arrives(tmp_path):
    p = tmp_path / "sparse.csv"
    write_raymm(build_trace(["a", "b"], [[(400, 450)], [(700, 760)]], [(0, 1000)] * 2), p)
    fast = [{"name": "x", "fraction": 1.0, "gflops": 1.0, "up_mbps": 100, "down_mbps": 100}]
    sc = tiny_scenario(**{"rounds": 3, "population.devices": 4,
                          "population.tiers": [{"sensors": ["a", "b"], "count": 4}],
                          "population.trace": {"path": str(p)}, "population.hardware": fast,
                          "selection": {"name": "random", "k": 2},
                          "clock": {"mode": "seconds"}})
    df = pd.read_parquet(run(sc, out=tmp_path / "r").run_dir / "rounds.parquet")
    assert df["idle_seconds"].iloc[0] > 0
    starts = df["sim_start_seconds"].to_numpy()
    assert ((starts % 1000 >= 400) & (starts % 1000 < 450)
            | (starts % 1000 >= 700) & (starts % 1000 < 760)).all()


def test_eval_every_simulated_seconds(tmp_path):
    _, df = clock_run(tmp_path, clock={"mode": "seconds", "eval_every_seconds": 500.0},
                      eval={"every": 1000})
    evaluated = df[df["accuracy"].notna()]
    ends = df["sim_seconds_total"].to_numpy()
    before = np.concatenate([[0.0], ends[:-1]])
    crossed = (ends // 500) > (before // 500)
    crossed[-1] = True  # the last round is always evaluated
    assert evaluated["round"].tolist() == df["round"][crossed].tolist()


def test_resume_is_exact(tmp_path):
    """A run resumed from its round-3 checkpoint (the clock's start, idle and totals in the
    server's state) ends with the same rows and parameters."""
    ref, df_ref = clock_run(tmp_path, name="full", output={
        "tensorboard": False, "checkpoint_every": 3, "keep_checkpoints": 4},
        clock={"mode": "seconds", "round_end": "kth", "overcommit": 0.5})
    again = resume_from_round_3(tmp_path, ref)
    df = pd.read_parquet(again.run_dir / "rounds.parquet")
    cols = [c for c in df_ref.columns if c not in ("wall_seconds",)]
    pd.testing.assert_frame_equal(df[cols], df_ref[cols])
    for g, v in ref.params.items():
        np.testing.assert_array_equal(again.params[g], v)


def test_round_clock_reads_a_trace_at_slot_instants(tmp_path):
    from raymm.app.build import build_world, load_scenario

    p = tmp_path / "t.csv"
    write_raymm(build_trace(["a", "b", "c"], [[(0, 120)], [(60, 180)], [(200, 260)]],
                            [(0, 300)] * 3), p)
    sc = load_scenario(tiny_scenario(**{"population.trace": {"path": str(p)},
                                        "population.slot_seconds": 60.0}))
    pop = build_world(sc).population
    for t in range(1, 12):
        np.testing.assert_array_equal(pop.online(t),
                                      pop.availability.available((t - 1) * 60.0))
    assert pop.online(1).any() and not pop.online(1).all()


def test_default_clock_is_the_round_clock():
    from raymm.app.build import load_scenario

    sc = load_scenario(tiny_scenario())
    assert sc.clock.mode == "rounds"
    d = sc.to_dict()
    assert "clock" not in d and "trace" not in d["population"]


def test_compare_on_a_simulated_time_axis(tmp_path):
    from raymm.app.cli import main

    clock_run(tmp_path, name="one")
    clock_run(tmp_path, name="two", clock={"mode": "seconds", "round_end": "kth",
                                           "overcommit": 0.5})
    out = tmp_path / "cmp"
    assert main(["compare", str(tmp_path / "runs"), "--out", str(out), "--time-axis"]) == 0
    assert (out / "accuracy_vs_sim_hours.png").stat().st_size > 0


def test_tensorboard_time_axis_and_availability(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    res, df = clock_run(tmp_path, name="tb", output={"tensorboard": True})
    acc = EventAccumulator(str(res.run_dir))
    acc.Reload()
    tags = acc.Tags()["scalars"]
    assert "vs_sim_seconds/accuracy" in tags and "availability/online_devices" in tags
    steps = [e.step for e in acc.Scalars("vs_sim_seconds/online")]
    assert steps == [int(round(s)) for s in df["sim_seconds_total"]]
    online = acc.Scalars("availability/online_devices")
    assert len(online) == 200 and max(e.value for e in online) <= 12
    assert "availability/online_and_selected" in acc.Tags()["images"]


def test_online_grid_reads_the_round_starts(tmp_path):
    from raymm.app.build import build_world, load_scenario
    from raymm.driver.rundir import RunWriter

    res, df = clock_run(tmp_path, name="grid")
    pop = build_world(load_scenario(res.run_dir / "config.yaml")).population
    ids = np.arange(pop.n)
    starts = df["sim_start_seconds"].tolist()
    grid = RunWriter.online_grid(pop, ids, len(starts), starts)
    assert grid.sum(axis=0).tolist() == df["online"].tolist()
