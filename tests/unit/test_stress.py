"""The stress populations: a device is a population row plus a slice of one index array (tens of
bytes), never a model; 10,000 and 100,000 devices build in seconds."""

import importlib.util

import numpy as np

from raymm.api import build_world, load_scenario

from helpers import REPO


def stress_script():
    spec = importlib.util.spec_from_file_location(
        "stress", REPO / "scenarios" / "scripts" / "stress.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_an_idle_device_costs_a_few_hundred_bytes():
    world = build_world(load_scenario(REPO / "scenarios" / "stress" / "devices_10k.yaml"))
    pop = world.population
    assert pop.n == 10_000 and pop.num_samples.min() >= 4
    cost = stress_script().idle_bytes(world)
    # 42 bytes of columns + 8 per offset + 4 per sample index (20 samples on average)
    assert cost["population_bytes_per_device"] == (pop.nbytes()) / pop.n
    assert 42 + 8 + 4 * 4 <= cost["population_bytes_per_device"] < 200
    # the server's view: data size, 10 rounds of compute times, selection history, counters
    assert cost["observation_bytes_per_device"] <= 140
    assert cost["bytes_per_idle_device"] < 350
    # tiers and clocks as specified: 20/50/30 sensor tiers, a third each of the three patterns
    assert sorted(pop.tier_sensors) == [("acc",), ("acc", "gyro"), ("gyro",)]
    tiers, counts = np.unique(pop.tier, return_counts=True)
    assert {pop.tier_sensors[t]: c for t, c in zip(tiers, counts)} == \
        {("acc", "gyro"): 2000, ("acc",): 5000, ("gyro",): 3000}
    assert set(pop.pattern_names) == {"always", "business_hours", "overnight"}
