"""Encoders of a lock-step program run only for the devices that need them
(raymm.training.lockstep.encoders): a device that lacks a sensor runs its encoder on one zero
sample, with the numbers of every encoder on every batch and the same bits in every packing."""

from __future__ import annotations

import numpy as np
import pytest

from raymm.models.network import MultimodalNet
from raymm.training.lockstep.encoders import SensorEncoders

from helpers import tiny_run_params

TOL = 1e-5


@pytest.fixture(autouse=True)
def _out_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # run(out=None) writes under ./runs


def test_a_sensor_a_device_lacks_runs_its_encoder_on_one_zero_sample(monkeypatch):
    """In a program that mixes sensor sets, a device that lacks a sensor and does not train its
    encoder has one embedding of it all round: the devices that hold the sensor run its encoder
    on their minibatch, the others on a single zero sample (`raymm.training.lockstep.encoders`).
    The same numbers as every encoder on every device's batch, to float32 rounding, and still
    the same bits whatever the packing."""
    sensors = {"a": {"dim": 3, "length": 32, "informativeness": 1.0},
               "b": {"dim": 2, "length": 32, "informativeness": 0.5}}
    base = {"dataset.sensors": sensors, "model.encoder": "cnn1d", "selection.k": 8,
            "rounds": 2, "execution.training.path": "lockstep", "training.upload": "held",
            "training.optimizer": "adam", "training.lr": 0.01, "training.batch_size": 7}
    batch_sizes: list[int] = []
    encode = SensorEncoders._encode
    monkeypatch.setattr(SensorEncoders, "_encode", lambda self, m, p, x:
                        batch_sizes.append(int(x.shape[1])) or encode(self, m, p, x))
    ref, _ = tiny_run_params(base)
    assert 1 in batch_sizes and max(batch_sizes) == 7
    for per in (1, 5):
        got, _ = tiny_run_params({**base, "execution.devices_per_actor": per})
        for g in ref:
            assert np.array_equal(got[g], ref[g]), (per, g)
    batch_sizes.clear()
    monkeypatch.setattr(MultimodalNet, "takes_embeddings", False)
    every, _ = tiny_run_params(base)
    assert not batch_sizes
    for g in ref:
        np.testing.assert_allclose(every[g], ref[g], rtol=0, atol=TOL, err_msg=g)
