"""BMSFed's server side (policies.aggregation.bmsfed): count-weighted prototypes, the
imbalance ratio, and the update distances it publishes for selection."""

from __future__ import annotations

import numpy as np

from policies.aggregation.bmsfed import (
    DIST,
    KNOWN,
    RATIO,
    BMSFedAggregation,
    imbalance_ratio,
    merge_prototypes,
)
from policies.objective.bmsfed import CORRECT, COUNTS, MEANS, PROTO
from raymm.protocol.messages import HostResult, merge_results
from raymm.protocol.observations import Observations
from raymm.protocol.seams import AggregationContext


def test_prototypes_are_count_weighted_and_kept_where_nobody_reported() -> None:
    means = np.array([[[[1.0], [0.0]]], [[[4.0], [0.0]]]])    # [n=2, M=1, C=2, E=1]
    counts = np.array([[[1, 0]], [[2, 0]]])
    protos, ok = merge_prototypes(means, counts, np.full((1, 2, 1), 7.0, np.float32),
                                  np.array([[False, True]]))
    assert protos[0, :, 0].tolist() == [3.0, 7.0]      # (1·1 + 2·4)/3; class 2 kept
    assert ok.tolist() == [[True, True]]


def test_imbalance_ratio() -> None:
    r = imbalance_ratio(np.array([[6, 3], [2, -1], [4, 0], [0, 0]]))
    assert r[0] == 2.0 and np.isnan(r[1]) and r[2] == np.inf and r[3] == 1.0


def test_update_distances_prototypes_and_ratio_after_a_round() -> None:
    agg = BMSFedAggregation(None)
    agg.bind(None, ("a", "v"))  # type: ignore[arg-type]
    params = {"sensor:a": np.zeros(2, np.float32), "sensor:v": np.zeros(1, np.float32),
              "shared": np.zeros(1, np.float32)}
    extras = {MEANS: np.ones((2, 2, 2, 1), np.float32), COUNTS: np.ones((2, 2, 2), np.int32),
              CORRECT: np.array([[6, 3], [5, -1]], np.int32)}
    res = HostResult(np.array([0, 2]), np.array([10, 30]), np.zeros(2), np.zeros(2),
                     {"sensor:a": np.array([[3.0, 4.0], [0.0, 0.0]], np.float32),
                      "sensor:v": np.array([[1.0]], np.float32),
                      "shared": np.array([[1.0], [5.0]], np.float32)},
                     {"sensor:a": np.array([0, 1]), "sensor:v": np.array([0]),
                      "shared": np.array([0, 1])}, extras)
    obs = Observations.register(np.array([[1, 1], [1, 1], [1, 0]], bool), np.zeros(3, int))
    out = agg.aggregate(params, merge_results([res]), AggregationContext(1, ("a", "v"), obs, 0))
    assert out["shared"].tolist() == [4.0]                 # (10·1 + 30·5)/40
    assert out["sensor:v"].tolist() == [1.0]               # device 0 alone
    view = agg.selection_view()
    assert view[KNOWN].tolist() == [True, False, True]
    assert view[DIST + "a"][0, 2] == 5.0 == view[DIST + "a"][2, 0]   # ||(-3,-4) - (0,0)||
    assert view[DIST + "v"][0, 2] == 1.0
    assert view[RATIO][0] == 2.0 and np.isnan(view[RATIO][2])
    assert agg.extras(2)[PROTO].shape == (2, 2, 1)
