"""How a synchronous round ends on the simulated clock (raymm.population.clock): every
participant, the deadline, or the k-th completion; what a departure costs."""

from __future__ import annotations

import math

import numpy as np

from raymm.population.clock import close_round

INF = math.inf


def test_close_all_waits_for_everyone_or_their_departure():
    rc = close_round(np.array([10.0, 30.0, 20.0]), np.array([INF, 25.0, INF]))
    assert rc.kept.tolist() == [True, False, True]
    assert rc.departed.tolist() == [False, True, False]
    assert rc.duration == 25.0  # the last event: device 1 leaving
    np.testing.assert_array_equal(rc.work, [10.0, 25.0, 20.0])
    np.testing.assert_array_equal(rc.wasted, [0.0, 25.0, 0.0])


def test_close_deadline():
    rc = close_round(np.array([10.0, 30.0, 50.0]), np.array([INF, 25.0, INF]), deadline=40.0)
    assert rc.kept.tolist() == [True, False, False]
    assert rc.departed.tolist() == [False, True, False]
    assert rc.dropped.tolist() == [False, False, True]
    assert rc.duration == 40.0
    np.testing.assert_array_equal(rc.wasted, [0.0, 25.0, 40.0])
    # everyone done before the deadline: the round ends with the last one
    assert close_round(np.array([3.0, 7.0]), np.array([INF, INF]), 40.0).duration == 7.0
    # a device leaving after the deadline was dropped at the deadline, not departed
    rc = close_round(np.array([60.0]), np.array([50.0]), deadline=40.0)
    assert rc.dropped.tolist() == [True] and rc.duration == 40.0


def test_close_kth_keeps_the_first_k():
    finish = np.array([5.0, 9.0, 3.0, 7.0, 7.0])
    stay = np.array([INF, INF, INF, 6.0, INF])
    rc = close_round(finish, stay, keep=2)
    assert rc.kept.tolist() == [True, False, True, False, False]
    assert rc.duration == 5.0
    assert rc.departed.tolist() == [False, False, False, False, False]  # left after the end
    np.testing.assert_array_equal(rc.wasted, [0, 5, 0, 5, 5])
    rc = close_round(finish, stay, keep=3)  # ties broken by position: device 4 finishes 3rd
    assert rc.kept.tolist() == [True, False, True, False, True] and rc.duration == 7.0
    assert rc.departed.tolist() == [False, False, False, True, False]
    # fewer than k finish: the round waits for everyone, as round_end: all
    rc = close_round(np.array([4.0, 8.0]), np.array([INF, 2.0]), keep=2)
    assert rc.kept.tolist() == [True, False] and rc.duration == 4.0
