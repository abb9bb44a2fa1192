"""Following a run's rows (raymm.driver.tracking): Acc@B so far, early stopping (counted from
Harmony's fusion stage on), and what the summary reports about the best evaluation."""

from __future__ import annotations

from raymm.driver.tracking import RunTracker, summary_metrics
from raymm.units import GIB

from helpers import BUDGET_ROWS


def test_summary_reports_the_best_evaluation() -> None:
    s = summary_metrics(BUDGET_ROWS, 1.2)
    assert s["acc_at_budget"] == 0.7 and s["acc_at_half_budget"] == 0.5
    assert s["best_round"] == 20 and s["tier_f1"] == 0.6 and s["worst_drop"] == 0.2
    assert s["worst_drop_sensor"] == "a" and s["best_acc_tier/a"] == 0.55
    assert "acc_at_budget" not in summary_metrics(BUDGET_ROWS, None)


def test_tracker_budget_and_early_stopping() -> None:
    tr = RunTracker(budget_gib=1.0, patience=2)
    rows = [{"round": i, "accuracy": a, "bytes_total": g * GIB}
            for i, (a, g) in enumerate([(0.5, 0.2), (0.6, 0.4), (0.6, 0.8), (0.9, 1.1)])]
    assert [tr.update(dict(r)) for r in rows[:2]] == [False, False]
    third = dict(rows[2])
    assert tr.update(third) is False                      # 1 evaluation without improvement
    assert third["acc_at_budget"] == 0.6 and third["acc_at_half_budget"] == 0.6
    assert tr.update({"round": 99, "bytes_total": 0}) is False  # not an evaluation
    last = dict(rows[3])
    assert tr.update(last) is False and last["best_accuracy"] == 0.9
    assert last["acc_at_budget"] == 0.6                   # 1.1 GiB is over the budget
    assert tr.update({"round": 5, "accuracy": 0.9, "bytes_total": 2 * GIB}) is False
    assert tr.update({"round": 6, "accuracy": 0.8, "bytes_total": 2 * GIB}) is True
    assert RunTracker().update({"accuracy": 0.1, "bytes_total": 0}) is False


def test_patience_counts_only_fusion_stage_evaluations() -> None:
    tr = RunTracker(patience=2, patience_from=5)
    rows = [(1, 0.5), (2, 0.2), (3, 0.2), (4, 0.1), (5, 0.3), (6, 0.3)]
    stops = [tr.update({"round": t, "accuracy": a, "bytes_total": 0}) for t, a in rows]
    assert stops == [False] * 5 + [True]            # rounds 5 and 6: two without a new best
