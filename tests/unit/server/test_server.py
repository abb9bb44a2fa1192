"""The server (raymm.server.server): a device that misses the deadline counts as slow; the
server records the time it would have needed (a silent one, a penalty), so TIDE's speed score
stops preferring it."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from raymm.app.api import run
from raymm.server.server import Server

from helpers import tiny_scenario

HARDWARE = [  # device speed in GFLOPS: the tiny model's fast devices train for seconds
    {"name": "fast", "fraction": 0.75, "gflops": 2e-5, "up_mbps": 100, "down_mbps": 100,
     "jitter": 0.0},
    {"name": "slow", "fraction": 0.25, "gflops": 2e-8, "up_mbps": 100, "down_mbps": 100,
     "jitter": 0.0},
]


def always_late_run(tmp_path, **extra):
    """12 devices, always online; a quarter of them 1000x slower than the rest and always past
    the deadline; TIDE's selection by speed alone, 4 per round."""
    sc = tiny_scenario(**{
        "rounds": 8, "population.availability": [{"pattern": "always", "fraction": 1.0}],
        "population.hardware": HARDWARE, "faults.deadline_seconds": 500.0,
        "selection": {"name": "tide", "k": 4, "alpha": 1.0, "beta": 0.0, "gamma": 0.0},
        **extra})
    res = run(sc, out=tmp_path)
    devices = pd.read_parquet(res.run_dir / "devices.parquet")
    rounds = pd.read_parquet(res.run_dir / "rounds.parquet")
    return devices, rounds


def test_an_always_late_device_is_not_preferred_once_seen(tmp_path):
    devices, rounds = always_late_run(tmp_path)
    slow = devices[devices["hardware"] == "slow"]
    fast = devices[devices["hardware"] == "fast"]
    assert len(slow) == 3 and rounds["stragglers"].iloc[:3].sum() == 3  # each seen late once
    # all scores start equal (v = 0.5): three rounds try every device once; from then on the
    # late ones score v = 1 / (1 + their time) and lose to every device that trained
    assert (slow["times_selected"] == 1).all(), slow[["device", "times_selected"]]
    assert rounds["stragglers"].iloc[3:].sum() == 0
    assert fast["times_selected"].sum() == 8 * 4 - 3


def test_late_and_silent_devices_are_recorded(monkeypatch):
    """A straggler's own time, and for a device that crashed or lost its host the round's
    longest time, at least the deadline."""
    seen: list[tuple[np.ndarray, np.ndarray]] = []

    class Obs:
        def observe_trained(self, ids, seconds):
            seen.append((np.asarray(ids), np.asarray(seconds)))

    class Batch:
        device_ids = np.array([1, 4])
        compute_seconds = np.array([3.0, 900.0])  # device 4 would need 900 s
        failed = np.array([2])
        n = 2

    class Faults:
        deadline_seconds = 500.0

    server = Server.__new__(Server)
    server.obs = Obs()
    server.sc = type("Sc", (), {"faults": Faults})()
    server._observe_times(Batch(), lost=np.array([7]))
    (ids, secs), (silent, penalty) = seen
    assert ids.tolist() == [1, 4] and secs.tolist() == [3.0, 900.0]
    assert silent.tolist() == [2, 7] and penalty.tolist() == [900.0, 900.0]
    seen.clear()
    Batch.compute_seconds = np.array([3.0, 4.0])
    server._observe_times(Batch(), lost=None)
    assert seen[1][1].tolist() == [500.0]  # nobody slower answered: the deadline it waited


@pytest.mark.parametrize("lost", [None, np.zeros(0, np.int64)])
def test_nothing_silent_records_nothing_more(lost):
    calls = []

    class Obs:
        def observe_trained(self, ids, seconds):
            calls.append(ids)

    class Batch:
        device_ids = np.array([0])
        compute_seconds = np.array([1.0])
        failed = np.zeros(0, np.int64)
        n = 1

    server = Server.__new__(Server)
    server.obs = Obs()
    server.sc = type("Sc", (), {"faults": type("F", (), {"deadline_seconds": None})})()
    server._observe_times(Batch(), lost)
    assert len(calls) == 1
