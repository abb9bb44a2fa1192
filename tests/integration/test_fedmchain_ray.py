"""Ray gives exactly the serial numbers for a short FedMChain run (cluster models, periodic
sync, per-device evaluation on the actors)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from raymm.app.api import run

SCENARIO = Path(__file__).parents[2] / "scenarios" / "fedmchain_synthetic.yaml"
SETTINGS = ["rounds=6", "training.sync_every=2", "eval.every=3",
            "execution.actor.num_cpus=1"]


@pytest.mark.ray
def test_fedmchain_ray_equals_serial(tmp_path: Path, ray_session) -> None:
    # one serial host against two actors: packing must not change a number
    serial = run(SCENARIO, SETTINGS, out=tmp_path, executor="serial")
    on_ray = run(SCENARIO, SETTINGS + ["execution.devices_per_actor=12"], out=tmp_path,
                 executor="ray")
    for g, v in serial.params.items():
        assert np.array_equal(v, on_ray.params[g]), g
    keys = ["accuracy", "acc_multimodal", "mir", "acc_sensor/weak", "acc_tier/dom",
            "bytes_up", "bytes_down", "train_loss", "participated"]
    for a, b in zip(serial.rows, on_ray.rows):
        assert [a.get(k) for k in keys] == [b.get(k) for k in keys], a["round"]
