"""Asynchronous aggregation on Ray: the same numbers as the serial executor, and a Ray run
resumed from a checkpoint taken with updates in flight ends where the serial run does."""

import numpy as np
import pandas as pd
import pytest

from raymm.app.api import run
from raymm.driver.checkpoint import read

from helpers import async_scenario, resume_from_round_3


def assert_same_run(a, b):
    for g in a.params:
        assert np.array_equal(a.params[g], b.params[g]), g
    tables = [pd.read_parquet(r.run_dir / "rounds.parquet").drop(columns=["wall_seconds"])
              for r in (a, b)]
    pd.testing.assert_frame_equal(*tables, check_exact=True)


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.parametrize("method", ["fedbuff", "fedasync"])
def test_async_on_ray_is_the_serial_run(tmp_path, ray_session, method):
    serial = run(async_scenario(method), out=tmp_path / "serial")
    on_ray = run(async_scenario(method, **{"execution.executor": "ray"}), out=tmp_path / "ray")
    assert_same_run(serial, on_ray)
    first = sorted((on_ray.run_dir / "checkpoints").glob("*.safetensors"))[0]
    assert len(read(first).server["async"]["flight"]["ids"]) > 0   # updates in flight
    resumed = resume_from_round_3(tmp_path, on_ray)                 # resumed on Ray
    assert_same_run(serial, resumed)
