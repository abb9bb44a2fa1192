"""Strict lock-step mode (`RAYMM_STRICT_LOCKSTEP=1`, set by tests/conftest.py) reaches the
DeviceActors: the variable is in their environment, and a lock-step program that falls back
there stops the run with `LockstepFallback`, rather than reading as an actor's death (whose
devices would be lost for the round and the run go on)."""

from __future__ import annotations

import os
import shutil

import pytest

from raymm.app import plugins
from raymm.app.api import run
from raymm.training.lockstep.fallback import STRICT_VAR, LockstepFallback

from helpers import tiny_scenario

#: an objective that promises the lock-step contract and breaks it: a Python branch on a
#: tensor's value, which vmap refuses
BRANCHY = '''import torch.nn.functional as F

from raymm.protocol.registry import OBJECTIVES
from raymm.protocol.seams import LossInputs, Objective


@OBJECTIVES.register("strict_lab_branchy")
class Branchy(Objective):
    vectorisable = True
    mixes_sensor_sets = True

    def __init__(self, params):
        pass

    def loss(self, inp: LossInputs):
        loss = F.cross_entropy(inp.out.logits, inp.y, reduction="none")
        return loss.mean() if float(loss.max().detach()) > 0 else loss.sum()
'''


@pytest.fixture
def strict_lab(tmp_path, monkeypatch):
    """The objective as a plugin that only this process has on its path (it reaches the
    actors through their runtime environment)."""
    monkeypatch.setenv(plugins.NO_ENTRY_POINTS, "1")
    code = tmp_path / "code"
    code.mkdir()
    (code / "strict_lab.py").write_text(BRANCHY)
    monkeypatch.syspath_prepend(str(code))
    yield code
    plugins.unload("strict_lab")
    shutil.rmtree(code)


@pytest.mark.ray
def test_a_fallback_in_a_device_actor_stops_a_strict_run(tmp_path, strict_lab, ray_session):
    ray = ray_session

    @ray.remote(num_cpus=0)
    def strict_there() -> str | None:
        return os.environ.get(STRICT_VAR)

    assert ray.get(strict_there.remote()) == "1"
    sc = tiny_scenario(**{"objective": {"name": "strict_lab_branchy"},
                          "execution.executor": "ray", "rounds": 2})
    with pytest.raises(LockstepFallback, match="round 1: lock-step training fell back"):
        run(sc, out=tmp_path / "ray", plugins=["strict_lab"])
