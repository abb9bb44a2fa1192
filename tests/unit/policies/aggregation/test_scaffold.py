"""SCAFFOLD's server side (policies.aggregation.scaffold): the server control variate is the
mean change over all devices."""

from __future__ import annotations

import numpy as np
import pytest

from policies.aggregation.scaffold import Scaffold
from raymm.protocol.messages import UpdateBatch
from raymm.protocol.observations import Observations
from raymm.protocol.seams import AggregationContext


def test_server_variate_is_mean_change_over_all_devices() -> None:
    agg = Scaffold(None)
    obs = Observations.register(np.ones((4, 1), bool), np.zeros(4, np.int64))
    batch = UpdateBatch(np.array([0, 1]), np.array([1, 3]), np.zeros(2), np.zeros(2),
                        {"g": np.array([[0.0, 4.0], [4.0, 0.0]], np.float32)},
                        {"g": np.array([0, 1])},
                        {"scaffold_dc/g": np.array([[1.0, 2.0], [3.0, 2.0]], np.float32)},
                        np.zeros(0, np.int64), ())
    out = agg.aggregate({"g": np.zeros(2, np.float32)}, batch,
                        AggregationContext(1, ("a",), obs, 0))
    np.testing.assert_allclose(out["g"], [3.0, 1.0])                 # sample-weighted mean
    np.testing.assert_allclose(agg.extras(2)["scaffold_c/g"], [1.0, 1.0])  # (Σ Δc)/N, N = 4
    assert agg.state_dict()["c"]["g"] == pytest.approx([1.0, 1.0])
