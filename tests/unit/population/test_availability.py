"""Availability on the seconds axis (raymm.population.availability): periodic patterns read as
intervals agree with the round-indexed clock, and trace intervals answer available /
departure / next_arrival as a brute-force walk over the intervals does."""

from __future__ import annotations

import numpy as np
import pytest

from raymm.population.availability import PeriodicAvailability, TraceAvailability
from raymm.population.traces import build_trace


def _periodic(slot: float = 60.0) -> PeriodicAvailability:
    period = np.array([1, 60, 40, 5, 7, 3], np.int32)
    online = np.array([1, 40, 20, 0, 6, 1], np.int32)
    phase = np.array([0, 13, 39, 2, 6, 1], np.int32)
    return PeriodicAvailability(period, online, phase, slot)


def test_periodic_matches_round_clock() -> None:
    av = _periodic()
    for t in range(1, 130):
        expect = (t + av.phase) % av.period < av.online_len
        # any instant inside slot t: [(t-1)·S, t·S)
        for s in ((t - 1) * 60.0, (t - 1) * 60.0 + 59.9):
            assert np.array_equal(av.available(s), expect)


def test_periodic_departure_and_arrival() -> None:
    av = _periodic(10.0)
    for s in np.arange(0.0, 900.0, 3.7):
        on = av.available(s)
        dep, arr = av.departure(s), av.next_arrival(s)
        for i in range(av.n):
            if on[i]:
                assert arr[i] == s
                if av.online_len[i] == av.period[i]:
                    assert dep[i] == np.inf
                    continue
                assert dep[i] > s
                # available up to just before the departure, not at it
                assert av.available(dep[i] - 1e-6, np.array([i]))[0]
                assert not av.available(dep[i], np.array([i]))[0]
            else:
                assert dep[i] == s
                if av.online_len[i] == 0:
                    assert arr[i] == np.inf
                    continue
                assert arr[i] > s
                assert av.available(arr[i], np.array([i]))[0]
                assert not av.available(arr[i] - 1e-6, np.array([i]))[0]


def _walk(intervals: np.ndarray, w0: float, w1: float, origin: float, s: float
          ) -> tuple[bool, float, float]:
    """Brute force over 4 repeats of the window: (available, departure, next arrival)."""
    span = w1 - w0
    tau = origin + s
    k0 = np.floor((tau - w0) / span)
    spans = [(a + (k0 + r) * span, b + (k0 + r) * span) for r in range(-1, 4)
             for a, b in intervals]
    merged: list[list[float]] = []
    for a, b in sorted(spans):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    for a, b in merged:
        if a <= tau < b:
            return True, s + (b - tau), s
        if a > tau:
            return False, s, s + (a - tau)
    return False, s, np.inf


def test_trace_matches_brute_force() -> None:
    rows = [
        [(100.0, 110.0), (130.0, 160.0), (190.0, 200.0)],   # last runs to the window's end
        [(50.0, 60.0)],
        [(100.0, 120.0), (115.0, 140.0)],                    # overlapping: merged
        [],                                                  # never available
        [(20.0, 220.0)],                                     # clipped to its window: always
    ]
    windows = [(100.0, 200.0), (0.0, 300.0), (90.0, 150.0), (0.0, 10.0), (100.0, 200.0)]
    trace = build_trace([f"d{i}" for i in range(5)], rows, windows)
    entry = np.array([0, 1, 2, 3, 4, 0, 2], np.int32)
    av = TraceAvailability(trace, entry)
    for s in np.arange(0.0137, 900.0, 2.3):  # off the intervals' integer edges
        on, dep, arr = av.available(s), av.departure(s), av.next_arrival(s)
        for i, e in enumerate(entry):
            iv = trace.intervals(int(e))
            if iv.size == 0:
                assert not on[i] and arr[i] == np.inf
                continue
            w0, w1 = trace.window_start[e], trace.window_end[e]
            want = _walk(iv, w0, w1, trace.origin, s)
            if w1 - w0 <= iv[:, 1].sum() - iv[:, 0].sum():  # online the whole window
                assert on[i] and dep[i] == np.inf
                continue
            assert on[i] == want[0], (s, i)
            assert dep[i] == pytest.approx(want[1]), (s, i)
            assert arr[i] == pytest.approx(want[2]), (s, i)


def test_subsets_and_order() -> None:
    av = _periodic()
    ids = np.array([5, 0, 3])
    assert np.array_equal(av.available(700.0, ids), av.available(700.0)[ids])
    assert np.array_equal(av.departure(700.0, ids), av.departure(700.0)[ids])
