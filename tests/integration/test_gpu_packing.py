"""Fractional GPUs on fake GPUs: `num_gpus: 0.1` packs ten DeviceActors per GPU id; actors
that got a GPU torch cannot use train on CPU and give the same numbers as the serial run.

The session's Ray declares two GPUs that do not exist (tests/conftest.py), so every other Ray
test doubles as the check that CPU-only runs are unaffected by GPUs in the cluster.
"""

from collections import Counter

import numpy as np
import pytest

from actors.ray_executor import RayExecutor
from raymm.app.api import run
from raymm.app.build import build_world, load_scenario
from raymm.sim.engine import run_rounds

from helpers import tiny_scenario
from needs import batched_matmul_is_batch_invariant


@pytest.mark.ray
@pytest.mark.slow
def test_point_one_gpu_actors_pack_ten_per_gpu(tmp_path, ray_session):
    raw = tiny_scenario(**{
        "rounds": 2, "population.devices": 40,
        "population.tiers": [{"sensors": ["a", "b"], "fraction": 0.5},
                             {"sensors": ["a"], "fraction": 0.5}],
        "execution.executor": "ray", "execution.devices_per_actor": "auto",
        "execution.actor": {"num_cpus": 0.05, "num_gpus": 0.1, "max_restarts": 0},
        "execution.training.path": "lockstep"})
    sc = load_scenario(raw)
    ex = RayExecutor(sc.execution)
    ex.start(build_world(sc))
    try:
        assert (ex.packing.num_actors, ex.packing.devices_per_actor) == (20, 2)
        placements = ex.placements()
        per_gpu = Counter(g for p in placements for g in p["gpu_ids"])
        assert per_gpu == {"0": 10, "1": 10}
        assert all(len(p["gpu_ids"]) == 1 and p["torch_device"] == "cpu" for p in placements)
        assert sum(p["devices"] for p in placements) == 40
        run_rounds(ex, sc, 1, lambda row: None)
        ray_params = ex.server_state()["params"]
    finally:
        ex.shutdown()
    ref = run(load_scenario({**raw, "execution": {"executor": "serial"}}), out=tmp_path).params
    for g in ref:
        if batched_matmul_is_batch_invariant():
            assert np.array_equal(ray_params[g], ref[g]), g
        else:  # lock-step in blocks of 2 here, of 40 serially: last bits (tests/needs.py)
            np.testing.assert_allclose(ray_params[g], ref[g], rtol=0, atol=1e-6, err_msg=g)
