"""Headline metrics under a budget (raymm.server.metrics), by hand: Acc@B, tier-restricted F1,
the worst-case drop."""

from __future__ import annotations

import math

import numpy as np
import pytest

from raymm.server.metrics import acc_at_budget, less_equipped, pooled_f1, worst_drop

from helpers import BUDGET_ROWS


def test_acc_at_budget() -> None:
    assert acc_at_budget(BUDGET_ROWS, 1.2) == 0.7
    assert acc_at_budget(BUDGET_ROWS, 1.0) == 0.7      # Ψ[t] ≤ B includes the boundary
    assert acc_at_budget(BUDGET_ROWS, 0.6) == 0.5      # B/2 for B = 1.2
    assert acc_at_budget(BUDGET_ROWS, 0.4) is None     # no evaluation within the budget
    assert acc_at_budget(BUDGET_ROWS, 99.0) == 0.7


def test_worst_drop_and_pooled_f1() -> None:
    assert worst_drop(0.9, {"a": 0.6, "b": 0.8}) == (pytest.approx(0.3), "a")
    assert worst_drop(0.9, {"a": 0.7, "b": 0.7})[1] == "a"
    d, m = worst_drop(0.9, {})
    assert math.isnan(d) and m is None
    # pooled: y [0,1,0,1] vs [0,1,0,0]; class 0: P 2/3, R 1 → F1 .8; class 1: P 1, R ½ → 2/3
    y = np.array([0, 1])
    assert pooled_f1(y, [np.array([0, 1]), np.array([0, 0])], 2) == pytest.approx(
        (0.8 + 2 / 3) / 2)
    assert less_equipped([("a", "b"), ("a",), ("b",), ("a",)], ("a", "b")) == [("a",), ("b",)]
