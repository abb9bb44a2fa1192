"""Same seed, same numbers: serial == Ray, whatever the packing of devices into actors."""

import numpy as np
import pandas as pd
import pytest

from raymm.app.api import run
from raymm.app.build import load_scenario

from helpers import tiny_scenario

WALL = ["wall_seconds"]


def _run(tmp_path, executor, per_actor, server="actor"):
    sc = load_scenario(tiny_scenario(**{"rounds": 4, "eval.every": 2,
                                        "execution.executor": executor,
                                        "execution.server": server,
                                        "execution.devices_per_actor": per_actor,
                                        # 3 devices per actor = 4 actors on 2 CPUs
                                        "execution.actor": {"num_cpus": 0.1},
                                        # pooled and per-device evaluation both
                                        "population.local_test_fraction": 0.25,
                                        "eval.scope": "both"}))
    res = run(sc, out=tmp_path / f"{executor}-{per_actor}-{server}")
    table = pd.read_parquet(res.run_dir / "rounds.parquet").drop(columns=WALL)
    return res.params, table


@pytest.mark.ray
def test_serial_and_ray_are_bit_identical(tmp_path, ray_session):
    ref_params, ref_table = _run(tmp_path, "serial", "auto")
    assert ref_table["participated"].sum() > 0 and ref_table["accuracy"].notna().sum() == 2
    assert ref_table["personal_accuracy"].notna().sum() == 2
    # one device per host in-process: twelve actors would cost a minute of process starts
    for executor, per_actor, server in [("serial", 5, "actor"), ("serial", 1, "actor"),
                                        ("ray", 3, "actor"),
                                        ("ray", 5, "actor"), ("ray", "auto", "actor"),
                                        ("ray", 5, "driver")]:
        params, table = _run(tmp_path, executor, per_actor, server)
        assert params.keys() == ref_params.keys()
        for g in ref_params:
            assert np.array_equal(params[g], ref_params[g]), (executor, per_actor, server, g)
        pd.testing.assert_frame_equal(table, ref_table, check_exact=True)


def test_different_seed_gives_different_numbers(tmp_path):
    a = run(load_scenario(tiny_scenario(seed=1)), out=tmp_path)
    b = run(load_scenario(tiny_scenario(seed=2)), out=tmp_path)
    assert not np.array_equal(a.params["shared"], b.params["shared"])
