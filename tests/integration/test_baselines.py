"""The baselines (server optimizers, Harmony, FedProto) across packings and a resume: hosts of
any size give the same numbers bit for bit, and a run resumed from a checkpoint ends
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


@pytest.mark.parametrize("method", METHODS)
def test_packing_does_not_change_the_run(method: str, tmp_path: Path) -> None:
    """Hosts of uneven blocks (5, 5, 2 devices: each pre-sums its block for a combinable
    aggregator) give the one-host run's numbers. Ray's own part, a DeviceActor per host, is
    test_every_policy.py's (every registered aggregator on Ray against serial) and
    test_equivalence.py's (packings on Ray)."""
    ref = run(load_scenario(scenario(method)), out=tmp_path / "one")
    assert table(ref.run_dir)["participated"].sum() > 0
    res = run(load_scenario(scenario(method, **{"execution.devices_per_actor": 5})),
              out=tmp_path / "five")
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
