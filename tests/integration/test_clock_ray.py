"""The synchronous round on the seconds clock (docs/time.md) on Ray: the same rows and
parameters as the serial executor, departures and over-commitment included."""

import numpy as np
import pandas as pd
import pytest

from raymm.app.api import run
from raymm.population.traces import build_trace, write_raymm

from helpers import tiny_scenario

ROWS = [[(0, 300), (600, 900)], [(100, 1000)], [(0, 50), (60, 2000)], [(500, 700)]]


@pytest.mark.ray
@pytest.mark.slow
def test_seconds_clock_on_ray_is_the_serial_run(tmp_path, ray_session):
    trace = write_raymm(build_trace(["a", "b", "c", "d"], ROWS, [(0, 1000)] * 4),
                        tmp_path / "trace.csv")
    runs = {}
    for ex in ("serial", "ray"):
        sc = tiny_scenario(**{
            "rounds": 6, "population.trace": {"path": str(trace)},
            "population.hardware": [{"gflops": 5e-7, "up_mbps": 1, "down_mbps": 1,
                                     "jitter": 0.5}],
            "selection": {"name": "random", "k": 3},
            "clock": {"mode": "seconds", "round_end": "kth", "overcommit": 0.5},
            "execution": {"executor": ex, "devices_per_actor": 6}})
        runs[ex] = run(sc, out=tmp_path / ex)
    a, b = runs["serial"], runs["ray"]
    for g in a.params:
        assert np.array_equal(a.params[g], b.params[g]), g
    tables = [pd.read_parquet(r.run_dir / "rounds.parquet").drop(columns=["wall_seconds"])
              for r in (a, b)]
    pd.testing.assert_frame_equal(*tables, check_exact=True)
    assert tables[0]["departed"].sum() > 0 and tables[0]["stragglers"].sum() > 0
