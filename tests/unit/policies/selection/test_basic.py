"""Uniform random and all-online selection (policies.selection.basic): K eligible devices drawn
from the round's stream without repetition, all of them when fewer than K."""

from __future__ import annotations

import numpy as np

from policies.selection.basic import AllOnline, RandomSelection
from raymm.protocol.seams import SelectionContext


def _ctx(eligible: list[int], k: int, seed: int = 0) -> SelectionContext:
    return SelectionContext(1, np.arange(20), np.array(eligible), k, None,
                            np.random.default_rng(seed))


def test_random_takes_k_distinct_eligible_devices_from_the_rounds_stream() -> None:
    eligible = [1, 3, 4, 8, 9, 12, 15, 19]
    picked = RandomSelection(None).select(_ctx(eligible, 3))
    assert picked.tolist() == sorted(set(picked.tolist())) and len(picked) == 3
    assert set(picked.tolist()) <= set(eligible)
    assert np.array_equal(picked, RandomSelection(None).select(_ctx(eligible, 3)))  # seeded
    draws = {tuple(RandomSelection(None).select(_ctx(eligible, 3, s))) for s in range(20)}
    assert len(draws) > 5
    assert RandomSelection(None).select(_ctx([2, 5], 3)).tolist() == [2, 5]


def test_all_online_takes_every_eligible_device_whatever_k() -> None:
    assert AllOnline(None).select(_ctx([0, 4, 6], 1)).tolist() == [0, 4, 6]
