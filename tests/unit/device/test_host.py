"""A host of simulated devices (raymm.device.host): the devices' own parameters, bases and
control variates survive DeviceHost.state_dict/load, into another packing."""

from __future__ import annotations

import numpy as np

from raymm.app.build import build_world, load_scenario
from raymm.sim.serial import SerialExecutor

from helpers import REPO

SCENARIO = REPO / "scenarios" / "fedmchain_synthetic.yaml"


def test_device_state_is_checkpointable() -> None:
    """Own parameters, bases and control variates survive DeviceHost.state_dict/load."""
    sc = load_scenario(SCENARIO, ["rounds=6", "training.sync_every=2"])
    world = build_world(sc)
    ex = SerialExecutor(devices_per_host=6)
    ex.start(world)
    for t in (1, 2):
        plan, bcast = ex.plan(t, ex.poll(t))
        ex.aggregate(t, (plan, bcast), ex.train(t, (plan, bcast)))
    saved = ex.host_states()
    assert saved and all("params/sensor:dom" in s and "base/sensor:dom" in s
                         for s in saved.values())
    fresh = SerialExecutor(devices_per_host=4)      # another packing reads the same states
    fresh.start(world)
    fresh.load_host_states(saved)
    again = fresh.host_states()
    assert sorted(again) == sorted(saved)
    for d, s in saved.items():
        assert all(np.array_equal(v, again[d][k]) for k, v in s.items())
