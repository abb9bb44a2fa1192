"""FedAvg on uploaded deltas (policies.aggregation.delta_mean), by hand: the sample-weighted
mean change of the senders is added to each group; a group nobody sent keeps its vector."""

from __future__ import annotations

import numpy as np

from policies.aggregation.delta_mean import DeltaMean
from raymm.protocol.messages import merge_results
from raymm.protocol.seams import AggregationContext

from helpers import host_result


def test_the_weighted_mean_delta_is_added_per_group() -> None:
    # devices 2 (n=10) and 6 (n=30) changed "g" by [4, 0] and [0, 4]; only device 6 sent "h"
    batch = merge_results([host_result([2, 6], [10, 30], {"g": [[4.0, 0.0], [0.0, 4.0]],
                                                           "h": [[-2.0]]},
                                       {"g": [0, 1], "h": [1]})])
    params = {"g": np.array([1.0, 1.0], np.float32), "h": np.array([5.0], np.float32),
              "k": np.array([7.0], np.float32)}
    agg = DeltaMean(None)
    assert agg.takes_deltas
    out = agg.aggregate(params, batch, AggregationContext(1, ("a",), None, 0))
    np.testing.assert_array_equal(out["g"], [1.0 + 1.0, 1.0 + 3.0])   # (10·4)/40, (30·4)/40
    np.testing.assert_array_equal(out["h"], [3.0])
    np.testing.assert_array_equal(out["k"], [7.0])
    assert out["g"].dtype == np.float32 and params["g"].tolist() == [1.0, 1.0]
