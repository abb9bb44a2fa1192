"""What a run reports at its end (raymm.driver.summary): the last and the best per-device
evaluation."""

from __future__ import annotations

from raymm.driver.summary import personal_summary


def test_personal_summary_reports_the_last_and_the_best_evaluation() -> None:
    rows = [{"round": 1, "accuracy": 0.5, "personal_accuracy": 0.6,
             "personal_acc_tier/a": 0.4, "personal_devices_evaluated": 3},
            {"round": 2},
            {"round": 3, "accuracy": 0.7, "personal_accuracy": 0.55,
             "personal_acc_tier/a": 0.45, "personal_devices_evaluated": 3},
            {"round": 4}]
    assert personal_summary(rows) == {"final_personal_accuracy": 0.55,
                                      "final_personal_acc_tier/a": 0.45,
                                      "best_personal_accuracy": 0.6}
    assert personal_summary([{"round": 1, "accuracy": 0.5}]) == {}
