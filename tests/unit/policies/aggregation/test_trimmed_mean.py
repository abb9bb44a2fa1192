"""The coordinate-wise trimmed mean (policies.aggregation.trimmed_mean), by hand and as an
aggregator per group."""

import numpy as np

from policies.aggregation.trimmed_mean import TrimmedMean, TrimmedMeanParams, trimmed_mean
from raymm.protocol.messages import HostResult, merge_results
from raymm.protocol.seams import AggregationContext


def test_trimmed_mean_by_hand():
    rows = np.array([[1.0, 10.0], [2.0, -50.0], [3.0, 20.0], [100.0, 30.0]], np.float32)
    # trim 0.25 of 4 -> drop 1 at each end per column: [2, 3] and [10, 20]
    np.testing.assert_array_equal(trimmed_mean(rows, 0.25), [2.5, 15.0])
    np.testing.assert_array_equal(trimmed_mean(rows, 0.0), rows.mean(0))


def test_trimmed_mean_aggregator_per_group():
    r = HostResult(np.array([0, 1, 2]), np.array([5, 5, 5]), np.zeros(3), np.zeros(3),
                   {"g": np.array([[0.0], [1.0], [9.0]], np.float32)},
                   {"g": np.array([0, 1, 2])})
    out = TrimmedMean(TrimmedMeanParams(trim=0.34)).aggregate(
        {"g": np.zeros(1, np.float32), "h": np.ones(1, np.float32)}, merge_results([r]),
        AggregationContext(1, ("a",), None, 0))
    assert out["g"].tolist() == [1.0] and out["h"].tolist() == [1.0]
