"""Per-device metrics (raymm.server.device_metrics) from host counts: ACC, per tier, ACC_m,
ACC per single modality, MIR; the adjusted Rand index, cluster recovery and accuracy per data
group of the clustered benchmark."""

from __future__ import annotations

import math

import numpy as np
import pytest
from sklearn.metrics import adjusted_rand_score

from raymm.protocol.messages import DeviceEval
from raymm.server.device_metrics import (
    adjusted_rand_index,
    cluster_recovery,
    device_metrics,
    modality_imbalance_ratio,
)


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


def test_ari_equals_scikit_learn():
    rng = np.random.default_rng(0)
    for _ in range(20):
        a, b = rng.integers(0, 4, 30), rng.integers(0, 3, 30)
        assert abs(adjusted_rand_index(a, b) - adjusted_rand_score(a, b)) < 1e-12
    a = rng.integers(0, 4, 30)
    assert adjusted_rand_index(a, (a + 1) % 4) == 1.0            # renaming changes nothing
    assert adjusted_rand_index(np.zeros(5), np.zeros(5)) == 1.0


def test_cluster_recovery_reads_the_senders_assignment():
    truth = np.array([0, 0, 1, 1, 2, 2])
    assignment = {"sensor:a": np.array([3, 3, 0, 0, 1, 1]), "sensor:b": np.array([0] * 6)}
    out = cluster_recovery(assignment, {"sensor:a": np.arange(6)}, truth)
    assert out == {"ssca/ari": 1.0}
    out = cluster_recovery(assignment, {"sensor:a": np.arange(6), "sensor:b": np.arange(6)},
                           truth)
    assert out["ssca/ari"] == 0.5
    assert cluster_recovery(assignment, {}, truth) == {}


def test_accuracy_per_group():
    ev = DeviceEval(np.arange(4), np.full(4, 10), np.array([10, 8, 2, 4]), np.zeros(4),
                    np.zeros((4, 1), np.int64), {})
    out = device_metrics([ev], np.zeros(4, np.int64), (("a",),), ("a",),
                         np.array([0, 0, 1, 1]))
    assert out["acc_group/0"] == 0.9 and abs(out["acc_group/1"] - 0.3) < 1e-12
    assert "acc_group/0" not in device_metrics([ev], np.zeros(4, np.int64), (("a",),), ("a",))
