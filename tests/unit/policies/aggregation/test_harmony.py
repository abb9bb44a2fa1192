"""Harmony's server (policies.aggregation.harmony): unimodal devices keep their stage-one
network."""

from __future__ import annotations

import numpy as np

from policies.aggregation.harmony import HarmonyAggregation
from raymm.protocol.messages import UpdateBatch
from raymm.protocol.observations import Observations
from raymm.protocol.seams import AggregationContext

MASK = np.array([[1, 1], [1, 0], [0, 1]], bool)        # devices: both, a only, b only


def test_unimodal_devices_keep_their_stage_one_network() -> None:
    agg = HarmonyAggregation(None)
    agg.fusion_start = 3
    obs = Observations.register(MASK, np.array([0, 1, 2]))

    def merge(t: int, params, rows):  # noqa: ANN001, ANN202
        agg.extras(t)
        b = UpdateBatch(np.array([0]), np.array([1]), np.zeros(1), np.zeros(1),
                        {g: np.asarray([r], np.float32) for g, r in rows.items()},
                        {g: np.array([0]) for g in rows}, {}, np.zeros(0, np.int64), ())
        return agg.aggregate(params, b, AggregationContext(t, ("a", "b"), obs, 0))

    p = {"sensor:a": np.zeros(2, np.float32), "sensor:b": np.zeros(1, np.float32)}
    p = merge(2, p, {"sensor:a": [1.0, 1.0], "sensor:b": [2.0]})       # end of stage 1
    assert agg.cluster_models() is None                                 # still stage 1
    agg.extras(3)
    clusters = agg.cluster_models()
    p = merge(3, p, {"sensor:a": [5.0, 5.0], "sensor:b": [6.0]})       # fusion fine-tuning
    assert clusters is not None
    assert clusters.clustered["sensor:a"].tolist() == [False, True, True]
    np.testing.assert_array_equal(clusters.params["sensor:a"][0], [1.0, 1.0])
    saved = agg.state_dict()
    again = HarmonyAggregation(None)
    again.load_state_dict(saved)
    np.testing.assert_array_equal(again.cluster_models().params["sensor:b"][0], [2.0])
