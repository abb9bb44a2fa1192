"""TIDE's aggregation (policies.aggregation.tide) by hand: pod merging, evidence weighting,
server class prototypes."""

from __future__ import annotations

import math

import numpy as np
import pytest

from policies.aggregation.tide import (
    TideAggregation,
    TideAggregationParams,
    evidence_weights,
    update_prototypes,
)
from raymm.protocol.messages import UpdateBatch
from raymm.protocol.seams import AggregationContext

from helpers import tide_observations


def batch(ids: list[int], n: list[int], updates: dict[str, list[list[float]]],
          senders: dict[str, list[int]], extras: dict[str, np.ndarray] | None = None
          ) -> UpdateBatch:
    return UpdateBatch(np.array(ids), np.array(n), np.zeros(len(ids)), np.zeros(len(ids)),
                       {g: np.array(v, np.float32) for g, v in updates.items()},
                       {g: np.array(v) for g, v in senders.items()}, extras or {},
                       np.zeros(0, np.int64), ())


GLOBAL = {"sensor:a": np.array([1.0, 1.0], np.float32),
          "sensor:b": np.array([9.0, 9.0], np.float32), "shared": np.array([0.0], np.float32)}


ACTX = AggregationContext(1, ("a", "b"), tide_observations(), 0)


def test_pod_merging_keeps_a_group_no_pod_member_sent() -> None:
    # devices 0 (1 sample) and 1 (3 samples) both hold only sensor a: nobody sends sensor:b
    b = batch([0, 1], [1, 3], {"sensor:a": [[1, 2], [5, 6]], "shared": [[0], [4]]},
              {"sensor:a": [0, 1], "shared": [0, 1]})
    out = TideAggregation(TideAggregationParams()).aggregate(GLOBAL, b, ACTX)
    np.testing.assert_array_equal(out["sensor:a"], [4.0, 5.0])   # (1·[1,2] + 3·[5,6]) / 4
    np.testing.assert_array_equal(out["shared"], [3.0])          # (1·0 + 3·4) / 4
    np.testing.assert_array_equal(out["sensor:b"], [9.0, 9.0])   # kept
    np.testing.assert_array_equal(GLOBAL["sensor:a"], [1.0, 1.0])  # input not mutated


def test_pod_merging_averages_each_sensor_over_its_pod_only() -> None:
    # device 0 holds a and b (2 samples), device 1 only b (2), device 2 only a (6)
    b = batch([0, 1, 2], [2, 2, 6],
              {"sensor:a": [[0, 0], [8, 8]], "sensor:b": [[2, 2], [4, 6]],
               "shared": [[1], [2], [3]]},
              {"sensor:a": [0, 2], "sensor:b": [0, 1], "shared": [0, 1, 2]})
    out = TideAggregation(TideAggregationParams()).aggregate(GLOBAL, b, ACTX)
    np.testing.assert_allclose(out["sensor:a"], [6.0, 6.0])      # (2·0 + 6·8) / 8
    np.testing.assert_allclose(out["sensor:b"], [3.0, 4.0])      # (2·[2,2] + 2·[4,6]) / 4
    np.testing.assert_allclose(out["shared"], [2.4])             # (2 + 4 + 18) / 10


def test_evidence_weighting() -> None:
    # weights |X_i|·exp(-loss): 1·e^0 = 1 and 3·e^{-ln 3} = 1: equal, so the plain mean
    aux = np.array([[0.0, np.nan], [math.log(3.0), np.nan]], np.float32)
    b = batch([0, 1], [1, 3], {"sensor:a": [[1, 2], [5, 6]], "shared": [[0], [4]]},
              {"sensor:a": [0, 1], "shared": [0, 1]}, {"aux_loss": aux})
    agg = TideAggregation(TideAggregationParams(weighting="evidence"))
    out = agg.aggregate(GLOBAL, b, ACTX)
    np.testing.assert_allclose(out["sensor:a"], [3.0, 4.0], rtol=1e-6)
    np.testing.assert_array_equal(out["shared"], [3.0])  # shared stays data-size weighted
    np.testing.assert_allclose(evidence_weights(np.array([2, 2, 4]), np.array([1.0, 2.0, np.nan]),
                                                1.0), [2.0, 2.0 / math.e, 0.0])
    with pytest.raises(RuntimeError, match="report_aux_loss"):
        agg.aggregate(GLOBAL, batch([0], [1], {"sensor:a": [[1, 1]]}, {"sensor:a": [0]}), ACTX)


def test_prototype_update_by_hand() -> None:
    means = np.array([[[1, 1], [0, 0], [2, 0]], [[4, 4], [9, 9], [0, 0]]], np.float32)
    counts = np.array([[2, 0, 1], [1, 0, 0]])
    p, has = update_prototypes(None, None, means, counts, 0.5)
    np.testing.assert_allclose(p[0], [2, 2])          # (2·[1,1] + 1·[4,4]) / 3
    np.testing.assert_allclose(p[2], [2, 0])
    assert has.tolist() == [True, False, True]
    p2, has2 = update_prototypes(p, has, np.array([[[4, 0], [6, 6], [7, 7]]], np.float32),
                                 np.array([[1, 2, 0]]), 0.5)
    np.testing.assert_allclose(p2, [[3, 1], [6, 6], [2, 0]])  # 0.5·old + 0.5·new; first; kept
    assert has2.tolist() == [True, True, True]


def test_prototypes_accumulate_from_round_one_and_are_sent_after_warmup() -> None:
    agg = TideAggregation(TideAggregationParams(warmup=2))
    extras = {"class_means": np.array([[[1.0, 0.0], [0.0, 2.0]]], np.float32),
              "class_counts": np.array([[3, 0]], np.int32)}
    one = batch([0], [3], {"shared": [[1]]}, {"shared": [0]}, extras)
    for t in (1, 2):
        assert agg.extras(t) == {}
        agg.aggregate(GLOBAL, one, ACTX)
    sent = agg.extras(3)
    np.testing.assert_array_equal(sent["prototypes"], [[1, 0], [0, 0]])
    np.testing.assert_array_equal(sent["prototype_mask"], [1, 0])
    # the server asks again after aggregating round 3 (to count bytes): same payload
    agg.aggregate(GLOBAL, batch([0], [1], {"shared": [[1]]}, {"shared": [0]}, {
        "class_means": np.array([[[3.0, 0.0], [0.0, 5.0]]], np.float32),
        "class_counts": np.array([[1, 1]], np.int32)}), ACTX)
    assert agg.extras(3) is sent
    np.testing.assert_array_equal(agg.extras(4)["prototypes"], [[2, 0], [0, 5]])
    state = agg.state_dict()
    fresh = TideAggregation(TideAggregationParams(warmup=2))
    fresh.load_state_dict(state)
    np.testing.assert_array_equal(fresh.extras(4)["prototypes"], [[2, 0], [0, 5]])
