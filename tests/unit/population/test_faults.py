"""Deterministic fault injection (raymm.population.faults): each decision a pure function of
(fault seed, round, unit), stragglers past the deadline, one line for a round with faults."""

from __future__ import annotations

import numpy as np

from raymm.config.schema import FaultSpec
from raymm.population.faults import device_crashes, fault_seed, host_kills, stragglers, summary_line


def test_crashes_and_kills_are_pure_functions_of_seed_round_and_unit() -> None:
    spec = FaultSpec(device_crash_prob=0.5, actor_kill_prob=0.5)
    devices = np.arange(200)
    a = device_crashes(spec, 3, 4, devices)
    assert np.array_equal(a, device_crashes(spec, 3, 4, devices))
    assert np.array_equal(a[50:], device_crashes(spec, 3, 4, devices[50:]))   # per device
    assert 0.35 < a.mean() < 0.65
    assert not np.array_equal(a, device_crashes(spec, 3, 5, devices))
    assert not np.array_equal(a, device_crashes(spec, 4, 4, devices))
    kills = host_kills(spec, 3, 4, 100)
    assert np.array_equal(kills, host_kills(spec, 3, 4, 100)) and 0.3 < kills.mean() < 0.7
    off = FaultSpec()
    assert not device_crashes(off, 3, 4, devices).any() and not host_kills(off, 3, 4, 5).any()
    assert fault_seed(off, 11) == 11 and fault_seed(FaultSpec(seed=5), 11) == 5


def test_stragglers_are_the_devices_past_the_deadline() -> None:
    seconds = np.array([1.0, 5.0, 5.5])
    assert stragglers(FaultSpec(deadline_seconds=5.0), seconds).tolist() == [False, False, True]
    assert not stragglers(FaultSpec(), seconds).any()


def test_a_round_with_faults_is_one_line() -> None:
    assert summary_line({"round": 3, "selected": 5, "participated": 5}) is None
    line = summary_line({"round": 3, "actors_killed": 1, "lost": 2, "failed": 1,
                         "stragglers": 1, "selected": 6, "participated": 2})
    assert line == ("round 3: 1 device host(s) died (2 selected devices lost), 1 device(s) "
                    "crashed, 1 straggler(s) past the deadline; 2 of 6 selected contributed")
    clock = summary_line({"round": 1, "departed": 2, "stragglers": 1, "sim_start_seconds": 0.0,
                          "selected": 4, "participated": 1})
    assert "2 device(s) left before finishing" in clock
    assert "1 straggler(s) still working at the round's end" in clock
