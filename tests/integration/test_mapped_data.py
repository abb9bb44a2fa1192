"""A memory-mapped dataset gives the numbers of the same data in memory, on serial and on Ray,
and on Ray it travels as the loader call that opens it, never as its arrays."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import ray

from raymm.app.api import run
from raymm.app.build import build_world, load_scenario, make_executor
from raymm.data.mapped import DataSource, is_memory_mapped

from helpers import tiny_scenario


def mapped_scenario(data: Path, executor: str, mmap: bool = True, **kw: object) -> dict:
    return tiny_scenario(**{
        "dataset": {"name": "synthetic_mmap", "path": str(data), "n_train": 1200, "n_test": 200,
                    "classes": 4, "clients": 12, "mmap": mmap,
                    "sensors": {"a": {"dim": 8, "informativeness": 1.0},
                                "b": {"dim": 6, "informativeness": 0.4}}},
        "population.partition": {"kind": "by_group"},
        "population.local_test_fraction": 0.25, "eval.scope": "both", "eval.every": 2,
        "execution.executor": executor, "execution.devices_per_actor": 5,
        "execution.actor": {"num_cpus": 0.1}, **kw})


def outcome(sc: dict, out: Path) -> tuple[dict, pd.DataFrame]:
    res = run(load_scenario(sc), out=out)
    return res.params, pd.read_parquet(res.run_dir / "rounds.parquet").drop(
        columns=["wall_seconds"])


@pytest.mark.ray
@pytest.mark.parametrize("path", ["sequential", "lockstep"])
def test_mapped_equals_in_memory_on_serial_and_ray(tmp_path: Path, ray_session,
                                                   path: str) -> None:
    data = tmp_path / "data"
    ref_params, ref_table = outcome(mapped_scenario(data, "serial", mmap=False,
                                                    **{"execution.training.path": path}),
                                    tmp_path / "memory")
    assert ref_table["participated"].sum() > 0 and ref_table["accuracy"].notna().sum() == 2
    for executor in ("serial", "ray"):
        params, table = outcome(mapped_scenario(data, executor,
                                                **{"execution.training.path": path}),
                                tmp_path / executor)
        assert params.keys() == ref_params.keys()
        for g in ref_params:
            assert np.array_equal(params[g], ref_params[g]), (executor, g)
        pd.testing.assert_frame_equal(table, ref_table, check_exact=True)


@pytest.mark.ray
def test_ray_sends_the_loader_call_and_actors_map_the_files(tmp_path: Path,
                                                           ray_session) -> None:
    sc = load_scenario(mapped_scenario(tmp_path / "data", "ray"))
    world = build_world(sc)
    assert is_memory_mapped(world.dataset)
    ex = make_executor(sc)
    ex.start(world)
    try:
        ex.ready()
        sent = ray.get(ex._shared[1][0])
        assert isinstance(sent, DataSource) and sent.name == "synthetic_mmap"
        mapped = ray.get([a.__ray_call__.remote(
            lambda actor: is_memory_mapped(actor.host.trainer.dataset)) for a in ex.actors])
        assert len(mapped) == 3 and all(mapped)
        assert ray.get(ex.server.__ray_call__.remote(
            lambda actor: is_memory_mapped(actor.server.dataset)))
    finally:
        ex.shutdown()
