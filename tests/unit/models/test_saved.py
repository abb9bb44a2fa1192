"""The trained model of a run (raymm.models.saved), written beside the run and loaded back
without any data: the global groups' parameters, a device's own parameters where it keeps them,
and one clear error for a directory without a model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from raymm.app.api import run
from raymm.errors import RaymmError
from raymm.models.layout import GroupLayout
from raymm.models.saved import MODEL, load_model

from helpers import tiny_scenario


def test_the_loaded_model_holds_the_runs_final_parameters(tmp_path: Path) -> None:
    res = run(tiny_scenario(rounds=2), out=tmp_path)
    assert (res.run_dir / MODEL).is_file()
    net = load_model(res.run_dir)
    assert not net.training and net.sensors == ("a", "b")
    flat = GroupLayout(net).flatten(net, list(res.params))
    for g, vec in res.params.items():
        assert np.array_equal(flat[g], vec), g


def test_a_device_that_keeps_its_own_parameters_loads_them(tmp_path: Path) -> None:
    res = run(tiny_scenario(rounds=2, method="local"), out=tmp_path)
    net = load_model(res.run_dir)
    shared = GroupLayout(net).flatten(net)
    own = {}
    for d in range(12):
        mine = load_model(res.run_dir, device=d)
        own[d] = GroupLayout(mine).flatten(mine)
    # trained alone and never averaged: a device that trained has a model of its own
    trained = [d for d in own if any(not np.array_equal(own[d][g], shared[g]) for g in shared)]
    assert len(trained) >= 2
    a, b = own[trained[0]], own[trained[1]]
    assert any(not np.array_equal(a[g], b[g]) for g in shared)
    with pytest.raises(RaymmError, match=r"device must be an id in 0\.\.11, got 12"):
        load_model(res.run_dir, device=12)


def test_a_directory_without_a_model_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(RaymmError, match=f"no {MODEL}"):
        load_model(tmp_path)
    (tmp_path / MODEL).write_bytes(b"not a model")
    with pytest.raises(RaymmError, match="cannot load the model"):
        load_model(tmp_path)
