"""Per-device metrics (ACC, per tier, ACC_m, ACC per single modality, MIR) from host counts, and
how `eval.scope` combines them with the pooled evaluation."""

from __future__ import annotations

import math

import numpy as np
import pytest

from raymm.driver.summary import personal_summary
from raymm.protocol.messages import DeviceEval
from raymm.protocol.record import RoundRecord
from raymm.server.device_metrics import device_metrics, modality_imbalance_ratio
from raymm.sim.engine import evaluate


def test_metrics_and_mir_on_a_hand_built_case() -> None:
    # tiers: 0 = audio only, 1 = visual only, 2 = both; four devices over two hosts
    tier = np.array([0, 1, 2, 2])
    tiers = (("audio",), ("visual",), ("audio", "visual"))
    host_b = DeviceEval(np.array([2, 3]), np.array([10, 5]), np.array([9, 5]),
                        np.array([1.0, 2.0]), np.array([[8, 4], [5, 1]]))
    host_a = DeviceEval(np.array([0, 1]), np.array([4, 10]), np.array([2, 7]),
                        np.array([3.0, 4.0]), np.array([[2, 0], [1, 7]]))
    m = device_metrics([host_b, host_a], tier, tiers, ("audio", "visual"))
    # per-device accuracies: 0.5, 0.7, 0.9, 1.0
    assert m["accuracy"] == pytest.approx((0.5 + 0.7 + 0.9 + 1.0) / 4)
    assert m["acc_tier/audio"] == pytest.approx(0.5)
    assert m["acc_tier/visual"] == pytest.approx(0.7)
    assert m["acc_tier/audio+visual"] == pytest.approx(0.95)
    assert m["acc_multimodal"] == pytest.approx(0.95)
    # audio alone on every device: 2/4, 1/10, 8/10, 5/5 -> 0.6; visual: 0, .7, .4, .2 -> 0.325
    assert m["acc_sensor/audio"] == pytest.approx(0.6)
    assert m["acc_sensor/visual"] == pytest.approx(0.325)
    assert m["mir"] == pytest.approx(0.6 / 0.325)
    assert m["test_loss"] == pytest.approx(10.0 / 29)


def test_devices_without_test_samples_are_skipped() -> None:
    ev = DeviceEval(np.array([0, 1]), np.array([0, 4]), np.array([0, 3]), np.zeros(2),
                    np.array([[0, 0], [3, 2]]))
    m = device_metrics([ev], np.array([0, 0]), (("a", "b"),), ("a", "b"))
    assert m["accuracy"] == 0.75 and m["devices_evaluated"] == 1
    assert m["mir"] == pytest.approx(1.5)


def test_mir_edge_cases() -> None:
    assert modality_imbalance_ratio([0.8, 0.4]) == 2.0
    assert modality_imbalance_ratio([0.8, 0.0]) == math.inf
    assert math.isnan(modality_imbalance_ratio([]))


class _Evaluations:
    """An executor stand-in: what each evaluation returns, and the order they were asked."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def evaluate(self, t: int) -> RoundRecord:
        self.asked.append("pooled")
        return RoundRecord({"accuracy": 0.9, "acc_tier/a": 0.5}, confusion=np.eye(2))

    def evaluate_devices(self, t: int) -> dict:
        self.asked.append("devices")
        return {"accuracy": 0.7, "acc_tier/a": 0.6, "devices_evaluated": 3}

    def get(self, value: object) -> object:
        return value


@pytest.mark.parametrize("scope,expected", [
    ("pooled", {"accuracy": 0.9, "acc_tier/a": 0.5}),
    ("devices", {"accuracy": 0.7, "acc_tier/a": 0.6, "devices_evaluated": 3}),
    ("both", {"accuracy": 0.9, "acc_tier/a": 0.5, "personal_accuracy": 0.7,
              "personal_acc_tier/a": 0.6, "personal_devices_evaluated": 3}),
])
def test_scope_picks_the_evaluations_and_names_them(scope: str, expected: dict) -> None:
    ex = _Evaluations()
    got = evaluate(ex, 10, scope)  # type: ignore[arg-type]
    assert got.row == expected
    assert (got.confusion is not None) == (scope != "devices")  # a picture, never a column
    assert ex.asked == {"pooled": ["pooled"], "devices": ["devices"],
                        "both": ["pooled", "devices"]}[scope]


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


def test_per_device_scopes_need_a_local_test_part() -> None:
    from raymm.app.build import load_scenario
    from raymm.errors import ScenarioError

    from helpers import tiny_scenario

    for scope in ("devices", "both"):
        with pytest.raises(ScenarioError, match=f"eval.scope: '{scope}' needs population."
                                                "local_test_fraction"):
            load_scenario(tiny_scenario(**{"eval.scope": scope}))
        load_scenario(tiny_scenario(**{"eval.scope": scope,
                                       "population.local_test_fraction": 0.2}))
