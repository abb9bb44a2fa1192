"""BMSFed's server side (policies.aggregation.bmsfed): count-weighted prototypes, the
imbalance ratio, and the update distances it publishes for selection."""

from __future__ import annotations

import numpy as np

from policies.aggregation.bmsfed import (
    DIST,
    KNOWN,
    RATIO,
    BMSFedAggregation,
    distance_rows,
    imbalance_ratio,
    merge_prototypes,
)
from policies.objective.bmsfed import CORRECT, COUNTS, MEANS, PROTO
from raymm.app.build import load_scenario
from raymm.config.schema import Scenario
from raymm.protocol.messages import HostResult, merge_results
from raymm.protocol.observations import Observations
from raymm.protocol.seams import AggregationContext

from helpers import tiny_scenario


def bmsfed_scenario() -> Scenario:
    """A two-sensor scenario of BMSFed's policies, its selection included."""
    return load_scenario(tiny_scenario(method="bmsfed", **{"selection.name": "bmsfed"}))


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
    agg.bind(bmsfed_scenario(), ("a", "v"))
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


def test_distance_rows_are_the_pairwise_norms_bit_for_bit() -> None:
    """Rows reused across the senders (symmetry) give the same bits as each row in full."""
    v = np.random.default_rng(3).normal(size=(7, 33)).astype(np.float32)
    rows = np.array([5, 1, 2])
    full = np.stack([np.sqrt(((v - v[r]).astype(np.float64) ** 2).sum(axis=1)) for r in rows])
    assert np.array_equal(distance_rows(v, rows), full)
    assert distance_rows(np.array([[0.0, 0.0], [3.0, 4.0]], np.float32),
                         np.array([1, 0])).tolist() == [[5.0, 0.0], [0.0, 5.0]]


def test_no_update_vectors_kept_when_another_selection_reads_none() -> None:
    agg = BMSFedAggregation(None)
    agg.bind(load_scenario(tiny_scenario(method="bmsfed")), ("a", "v"))   # selection: random
    assert not agg.tracks_updates
    params = {"sensor:a": np.zeros(2, np.float32), "shared": np.zeros(1, np.float32)}
    res = HostResult(np.array([1]), np.array([10]), np.zeros(1), np.zeros(1),
                     {"sensor:a": np.ones((1, 2), np.float32),
                      "shared": np.ones((1, 1), np.float32)},
                     {"sensor:a": np.array([0]), "shared": np.array([0])}, {})
    obs = Observations.register(np.ones((3, 2), bool), np.zeros(3, int))
    agg.aggregate(params, merge_results([res]), AggregationContext(1, ("a", "v"), obs, 0))
    view = agg.selection_view()
    assert view[KNOWN].tolist() == [False, True, False]
    assert DIST + "a" not in view and agg.vectors == {}
