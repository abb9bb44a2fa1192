import numpy as np

from policies.aggregation.fedavg import FedAvg
from raymm.protocol.combine import weighted_mean
from raymm.protocol.messages import HostResult, merge_results
from raymm.protocol.seams import AggregationContext


def test_weighted_mean_by_hand():
    rows = np.array([[1.0, 2.0], [3.0, 6.0]], np.float32)
    np.testing.assert_array_equal(weighted_mean(rows, np.array([1, 3]), np.array([4, 9])),
                                  [2.5, 5.0])


def _result(ids, n, updates, senders):
    k = len(ids)
    return HostResult(np.array(ids), np.array(n), np.zeros(k), np.zeros(k),
                      {g: np.array(v, np.float32) for g, v in updates.items()},
                      {g: np.array(s) for g, s in senders.items()})


def test_fedavg_per_group_over_senders_only():
    # devices 4 (n=10) and 9 (n=30) send "sensor:a"; only device 9 sends "shared";
    # "sensor:b" is sent by nobody and keeps its value.
    r1 = _result([9], [30], {"sensor:a": [[4.0, 0.0]], "shared": [[8.0]]},
                 {"sensor:a": [0], "shared": [0]})
    r2 = _result([4], [10], {"sensor:a": [[0.0, 4.0]]}, {"sensor:a": [0]})
    batch = merge_results([r1, r2])
    assert batch.device_ids.tolist() == [4, 9]
    params = {"sensor:a": np.zeros(2, np.float32), "sensor:b": np.array([7.0], np.float32),
              "shared": np.zeros(1, np.float32)}
    out = FedAvg(None).aggregate(params, batch, AggregationContext(1, ("a", "b"), None, 0))
    np.testing.assert_array_equal(out["sensor:a"], [3.0, 1.0])   # (30*4 + 10*0)/40, (10*4)/40
    np.testing.assert_array_equal(out["shared"], [8.0])
    np.testing.assert_array_equal(out["sensor:b"], [7.0])
    assert params["sensor:a"].tolist() == [0.0, 0.0]  # input not mutated


def test_merge_is_independent_of_packing():
    a = _result([1, 5], [3, 4], {"g": [[1.0], [5.0]]}, {"g": [0, 1]})
    b = _result([2], [7], {"g": [[2.0]]}, {"g": [0]})
    one = _result([1, 2, 5], [3, 7, 4], {"g": [[1.0], [2.0], [5.0]]}, {"g": [0, 1, 2]})
    for batch in (merge_results([a, b]), merge_results([b, a]), merge_results([one])):
        assert batch.device_ids.tolist() == [1, 2, 5]
        assert batch.num_samples.tolist() == [3, 7, 4]
        assert batch.updates["g"].ravel().tolist() == [1.0, 2.0, 5.0]
        assert batch.senders["g"].tolist() == [0, 1, 2]
