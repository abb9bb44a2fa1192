"""raymm's macro F1 (numpy counts) against scikit-learn's f1_score, bit for bit: every
committed table's tier F1 was computed by sklearn."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.metrics import f1_score

from raymm.server.evaluation import macro_f1


def sklearn_f1(y_true: np.ndarray, y_pred: np.ndarray, c: int) -> float:
    return float(f1_score(y_true, y_pred, labels=np.arange(c), average="macro",
                          zero_division=0))


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 12), st.integers(1, 400), st.integers(0, 2**31 - 1))
def test_equals_sklearn_bit_for_bit(classes: int, n: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    # classes that never occur (true or predicted) and skewed predictions are common in FL
    y_true = rng.integers(0, max(1, classes - rng.integers(0, classes)), n)
    y_pred = np.where(rng.random(n) < rng.random(), y_true, rng.integers(0, classes, n))
    assert macro_f1(y_true, y_pred, classes) == sklearn_f1(y_true, y_pred, classes)


@pytest.mark.parametrize("y_true,y_pred,c,expected", [
    ([0, 1, 2], [0, 1, 2], 3, 1.0),
    ([0, 0, 0], [1, 1, 1], 3, 0.0),
    ([0, 0, 1, 1], [0, 1, 1, 1], 2, (2 / 3 + 0.8) / 2),
    ([0, 0], [0, 0], 4, 0.25),      # three classes with no samples score 0 each
])
def test_known_values(y_true: list[int], y_pred: list[int], c: int, expected: float) -> None:
    assert macro_f1(np.array(y_true), np.array(y_pred), c) == pytest.approx(expected, abs=1e-15)
