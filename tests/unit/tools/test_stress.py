"""The stress populations: a device is a population row plus a slice of one index array and the
server's observations of it (a few hundred bytes), never a model; 10,000 and 100,000 devices
build in seconds, and the 1,000,000-device scenario validates (its rounds are not run here)."""


import numpy as np

from raymm.app.build import build_world, load_scenario
from raymm.app.cli import main
from raymm.sim.serial import SerialExecutor

from helpers import REPO, load_script


def stress_script():
    return load_script(REPO / "tools" / "stress.py")


def started(path):
    """The stress population `path` (under tools/stress/, or a path from the repository)."""
    found = REPO / "tools" / "stress" / path
    world = build_world(load_scenario(found if found.is_file() else REPO / path))
    ex = SerialExecutor()
    ex.start(world)
    ex.plan(1, ex.poll(1))
    return world, ex


def test_bytes_per_idle_device_is_the_sum_over_devices():
    script = stress_script()
    assert script.bytes_per_idle_device({"population": 300, "observations": 100}, 4) == 100.0
    assert script.bytes_per_idle_device({"a": 7}, 2) == 3.5


def test_an_idle_device_costs_a_few_hundred_bytes():
    world, ex = started("devices_10k.yaml")
    pop, n = world.population, 10_000
    assert pop.n == n and pop.num_samples.min() >= 4
    parts = stress_script().per_device_bytes(ex, n)
    # columns: sensor mask 2 x bool, tier int32, pattern int16, period, online length and
    # phase int32, hardware int16, speed and two bandwidths float32, sample count int64
    assert parts["population"] == (2 + 4 + 2 + 4 + 4 + 4 + 2 + 4 + 4 + 4 + 8) * n
    # int64 offsets, int32 sample indices (every assigned sample once)
    assert parts["data_index"] == 8 * (n + 1) + 4 * int(pop.data_offsets[-1])
    assert 4 * 4 * n <= parts["data_index"] - 8 * (n + 1) <= 4 * 200_000
    # the server's view: mask and tier copies, data size, 10 rounds of float64 compute times,
    # ring position, 10 rounds of selection flags, times selected and online
    assert parts["observations"] == (2 + 4 + 8 + 10 * 8 + 8 + 10 + 8 + 8) * n
    assert parts["server"] == 8 * n          # round of its last download
    assert parts["hosts"] == 8 * n           # its id in its host; FedAvg keeps nothing else
    assert parts["aggregator"] == 0
    cost = stress_script().bytes_per_idle_device(parts, n)
    assert cost == sum(parts.values()) / n
    assert 42 + 8 + 16 + 128 + 16 <= cost < 350
    # tiers and clocks as specified: 20/50/30 sensor tiers, a third each of the three patterns
    assert sorted(pop.tier_sensors) == [("acc",), ("acc", "gyro"), ("gyro",)]
    tiers, counts = np.unique(pop.tier, return_counts=True)
    assert {pop.tier_sensors[t]: c for t, c in zip(tiers, counts)} == \
        {("acc", "gyro"): 2000, ("acc",): 5000, ("gyro",): 3000}
    assert set(pop.pattern_names) == {"always", "business_hours", "overnight"}


def test_tide_selection_adds_its_two_caches_per_device():
    """TIDE's score keeps each device's mean compute time and its sensor set's size."""
    _, ex = started("experiments/adaptive/devices_10k_tide.yaml")
    parts = stress_script().per_device_bytes(ex, 10_000)
    assert parts["observations"] == (128 + 8 + 8) * 10_000


def test_the_million_device_scenario_validates(capsys):
    assert main(["validate", str(REPO / "tools" / "stress" / "devices_1m.yaml")]) == 0
    out = capsys.readouterr().out
    assert "valid scenario 'stress_1m'" in out and "1000000 devices" in out
    sc = load_scenario(REPO / "tools" / "stress" / "devices_1m.yaml")
    assert (sc.population.devices, sc.selection.k, sc.execution.training.path) == \
        (1_000_000, 10_000, "lockstep")
    assert sc.dataset_params()["n_train"] == 10 * sc.population.devices
