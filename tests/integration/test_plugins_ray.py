"""The example plugin (examples/mylab) on Ray: its code reaches the actors through their
runtime environment (the workers of this session's Ray cannot import it otherwise), and the run
is bit for bit the serial one, resumed from a checkpoint too."""

from __future__ import annotations

import importlib.util
import shutil
import sys

import numpy as np
import pandas as pd
import pytest

from raymm.app import plugins
from raymm.app.api import run

from helpers import REPO, resume_from_round_3, tiny_scenario

SCENARIO = REPO / "examples" / "mylab" / "scenario.yaml"
SETS = ["rounds=7", "eval.every=2", "output.checkpoint_every=3",
        "execution.devices_per_actor=6", "execution.actor={num_cpus: 0.5}"]


@pytest.fixture
def mylab(tmp_path, monkeypatch):
    """The example's package in a temporary folder that only this process has on sys.path."""
    monkeypatch.setenv(plugins.NO_ENTRY_POINTS, "1")
    code = tmp_path / "code"
    shutil.copytree(REPO / "examples" / "mylab" / "mylab", code / "mylab",
                    ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.syspath_prepend(str(code))
    yield code
    plugins.unload("mylab.fl")


def table(run_dir):
    return pd.read_parquet(run_dir / "rounds.parquet").drop(columns=["wall_seconds"])


def assert_same(a, b):
    assert a.params.keys() == b.params.keys()
    for g in a.params:
        assert np.array_equal(a.params[g], b.params[g]), g
    pd.testing.assert_frame_equal(table(a.run_dir), table(b.run_dir), check_exact=True)


@pytest.mark.ray
def test_example_plugin_on_ray_is_the_serial_run_and_resumes_exactly(tmp_path, mylab,
                                                                     ray_session):
    ray = ray_session

    @ray.remote(num_cpus=0)
    def importable() -> bool:
        return importlib.util.find_spec("mylab") is not None

    assert not ray.get(importable.remote()), "the workers must not have the plugin already"
    serial = run(SCENARIO, [*SETS, "execution.executor=serial"], out=tmp_path / "serial",
                 plugins=["mylab.fl"])
    assert serial.summary["final_accuracy"] > 0.6  # it learns
    on_ray = run(SCENARIO, [*SETS, "execution.executor=ray"], out=tmp_path / "ray",
                 plugins=["mylab.fl"])
    assert_same(serial, on_ray)
    assert (on_ray.run_dir / plugins.RECORD).is_file()
    resumed = resume_from_round_3(tmp_path, on_ray)  # on Ray, with the plugin loaded here
    assert_same(serial, resumed)
    assert "mylab" in sys.modules


LABNETS = """import math

import torch
from torch import nn

from raymm.models.factory import register_model


class Whole(nn.Module):
    def __init__(self, sensors, width, classes, hidden):
        super().__init__()
        self.sensors = sensors
        self.net = nn.Sequential(nn.Linear(width, hidden), nn.ReLU(), nn.Linear(hidden, classes))

    def forward(self, inputs):
        return self.net(torch.cat([inputs[m].flatten(1) for m in self.sensors], dim=1))


@register_model("labnets_mlp")
def mlp(ctx):
    width = sum(math.prod(s) for s in ctx.shapes.values())
    return Whole(ctx.sensors, width, ctx.num_classes, ctx.args.get("hidden", 8))
"""


@pytest.mark.ray
def test_a_plugin_model_factory_reaches_the_actors(tmp_path, monkeypatch, ray_session):
    """A one-file plugin that registers a model factory: every DeviceActor looks the factory
    up by name, so it must have imported the plugin before building its host."""
    monkeypatch.setenv(plugins.NO_ENTRY_POINTS, "1")
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "labnets.py").write_text(LABNETS)
    monkeypatch.syspath_prepend(str(tmp_path / "code"))
    raw = tiny_scenario(**{"model": {"factory": "labnets_mlp", "args": {"hidden": 12}},
                           "execution.devices_per_actor": 6,
                           "execution.actor": {"num_cpus": 0.5}})
    try:
        serial = run(raw, out=tmp_path / "serial", plugins=["labnets"])
        on_ray = run(raw, ["execution.executor=ray"], out=tmp_path / "ray", plugins=["labnets"])
    finally:
        plugins.unload("labnets")
    assert_same(serial, on_ray)
    assert "labnets" in (on_ray.run_dir / plugins.RECORD).read_text()


@pytest.mark.ray
@pytest.mark.parametrize("buffers", ["average", "local"])
def test_a_plugin_model_with_batch_norm_on_ray_is_the_serial_run(tmp_path, mylab, ray_session,
                                                                  buffers):
    """The example's parts model (batch norm in every encoder) with its statistics averaged or
    kept per device: Ray gives the serial numbers bit for bit, pooled and per-device metrics."""
    sets = [*SETS, "method=fedavg", "selection={name: random, k: 5}",
            "model.factory=mylab_wearable", f"model.buffers={buffers}", "eval.scope=both",
            "population.local_test_fraction=0.25", "rounds=4"]
    serial = run(SCENARIO, [*sets, "execution.executor=serial"], out=tmp_path / "s",
                 plugins=["mylab.fl"])
    on_ray = run(SCENARIO, [*sets, "execution.executor=ray"], out=tmp_path / "r",
                 plugins=["mylab.fl"])
    assert_same(serial, on_ray)
