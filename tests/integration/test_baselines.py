"""The baselines (server optimizers, Harmony, FedProto) on Ray and across a resume: Ray gives
the serial numbers bit for bit (any packing), and a run resumed from a checkpoint ends
exactly as an uninterrupted one (the server optimizers' moments, FedProto's prototypes and
every device's own model, Harmony's stage-1 snapshot)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from raymm.app.api import run
from raymm.app.build import load_scenario
from raymm.driver.checkpoint import load

from helpers import tiny_scenario

WALL = ["wall_seconds"]
METHODS = ["fedadam", "fedyogi", "fedadagrad", "harmony", "fedproto"]


def scenario(method: str, **kw) -> dict:
    extra = {} if method == "fedproto" else {"eval.scope": "both"}
    return tiny_scenario(**{"method": method, "rounds": 7, "eval.every": 2,
                            "population.local_test_fraction": 0.25, **extra, **kw})


def table(run_dir: Path) -> pd.DataFrame:
    return pd.read_parquet(run_dir / "rounds.parquet").drop(columns=WALL)


def assert_same(a, b) -> None:  # noqa: ANN001
    assert a.params.keys() == b.params.keys()
    for g in a.params:
        assert np.array_equal(a.params[g], b.params[g]), g
    pd.testing.assert_frame_equal(table(a.run_dir), table(b.run_dir), check_exact=True)


@pytest.mark.ray
@pytest.mark.parametrize("method", METHODS)
def test_ray_equals_serial(method: str, tmp_path: Path, ray_session) -> None:
    ref = run(load_scenario(scenario(method)), out=tmp_path / "serial")
    assert table(ref.run_dir)["participated"].sum() > 0
    # three actors with uneven blocks (5, 5, 2); one actor is test_every_policy.py's run
    res = run(load_scenario(scenario(method, **{
        "execution.executor": "ray", "execution.devices_per_actor": 5,
        "execution.actor": {"num_cpus": 0.1}})), out=tmp_path / "ray5")
    assert_same(ref, res)


@pytest.mark.parametrize("method", METHODS)
def test_resume_is_exact(method: str, tmp_path: Path) -> None:
    ref = run(load_scenario(scenario(method, **{"output.checkpoint_every": 3})), out=tmp_path)
    for keep in (3, 6):              # harmony: before its fusion stage (round 6) and within
        copy = tmp_path / f"from{keep}"
        shutil.copytree(ref.run_dir, copy)
        for ck in (copy / "checkpoints").glob("round-*.safetensors"):
            if int(ck.stem.split("-")[1]) != keep:
                ck.unlink()
        assert load(copy).round == keep
        assert_same(ref, run(resume=copy))
