"""Discounted UCB (policies.selection.bandit), by hand."""

from __future__ import annotations

import math

import numpy as np

from policies.selection.bandit import DiscountedUCB


def test_discounted_ucb_by_hand() -> None:
    b = DiscountedUCB(3, discount=0.5, explore=1.0)
    assert b.choose() == 0                          # unplayed arms first, in order
    b.update(0, 0.2)
    assert b.choose() == 1
    b.update(1, -0.1)
    assert b.choose() == 2
    b.update(2, 0.4)
    np.testing.assert_allclose(b.counts, [0.25, 0.5, 1.0])
    np.testing.assert_allclose(b.sums, [0.05, -0.05, 0.4])
    assert b.scale == 0.4
    log_n = math.log(1.75)
    expected = [0.05 / 0.25 / 0.4 + math.sqrt(log_n / 0.25),
                -0.05 / 0.5 / 0.4 + math.sqrt(log_n / 0.5),
                0.4 / 1.0 / 0.4 + math.sqrt(log_n / 1.0)]
    np.testing.assert_allclose(b.values(), expected)
    assert b.choose() == 0                          # 1.996 > 1.748 > 0.808
    greedy = DiscountedUCB(2, discount=1.0, explore=0.0)
    greedy.update(0, 1.0)
    greedy.update(1, 3.0)
    greedy.update(0, 4.0)
    assert greedy.choose() == 1 and greedy.values().tolist() == [2.5 / 4, 3 / 4]
