import numpy as np

from policies.aggregation.fedavg import FedAvg
from raymm.protocol.messages import merge_results
from raymm.protocol.seams import AggregationContext

from helpers import host_result


def test_fedavg_per_group_over_senders_only():
    # devices 4 (n=10) and 9 (n=30) send "sensor:a"; only device 9 sends "shared";
    # "sensor:b" is sent by nobody and keeps its value.
    r1 = host_result([9], [30], {"sensor:a": [[4.0, 0.0]], "shared": [[8.0]]},
                 {"sensor:a": [0], "shared": [0]})
    r2 = host_result([4], [10], {"sensor:a": [[0.0, 4.0]]}, {"sensor:a": [0]})
    batch = merge_results([r1, r2])
    assert batch.device_ids.tolist() == [4, 9]
    params = {"sensor:a": np.zeros(2, np.float32), "sensor:b": np.array([7.0], np.float32),
              "shared": np.zeros(1, np.float32)}
    out = FedAvg(None).aggregate(params, batch, AggregationContext(1, ("a", "b"), None, 0))
    np.testing.assert_array_equal(out["sensor:a"], [3.0, 1.0])   # (30*4 + 10*0)/40, (10*4)/40
    np.testing.assert_array_equal(out["shared"], [8.0])
    np.testing.assert_array_equal(out["sensor:b"], [7.0])
    assert params["sensor:a"].tolist() == [0.0, 0.0]  # input not mutated
