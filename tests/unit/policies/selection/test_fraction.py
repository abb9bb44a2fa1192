"""A fixed fraction of the eligible devices (policies.selection.fraction): round(fraction ·
eligible) of them, at least one, at most K, drawn without repetition."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from policies.selection.fraction import FractionParams, FractionSelection
from raymm.protocol.seams import SelectionContext


def _ctx(n: int, k: int) -> SelectionContext:
    return SelectionContext(1, np.arange(40), np.arange(0, 2 * n, 2), k, None,
                            np.random.default_rng(0))


@pytest.mark.parametrize("n, k, fraction, expected", [
    (10, 40, 0.7, 7), (5, 40, 0.7, 4),        # 3.5 + 0.5 -> 4
    (10, 3, 0.7, 3),                          # capped at K
    (1, 40, 0.1, 1),                          # at least one
    (10, 40, 1.0, 10), (0, 40, 0.7, 0)])
def test_the_count_is_the_rounded_fraction_within_one_and_k(n, k, fraction, expected) -> None:
    picked = FractionSelection(FractionParams(fraction=fraction)).select(_ctx(n, k))
    assert len(picked) == expected == len(set(picked.tolist()))
    assert set(picked.tolist()) <= set(range(0, 2 * n, 2))
    assert picked.tolist() == sorted(picked.tolist())


def test_the_fraction_is_a_share() -> None:
    assert FractionParams().fraction == 0.7
    for bad in (0.0, 1.5):
        with pytest.raises(ValidationError):
            FractionParams(fraction=bad)
