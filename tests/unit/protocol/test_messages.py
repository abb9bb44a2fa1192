"""Values that cross the server/device boundary (raymm.protocol.messages): merging hosts'
results does not depend on how the devices were packed."""

from raymm.protocol.messages import merge_results

from helpers import host_result


def test_merge_is_independent_of_packing():
    a = host_result([1, 5], [3, 4], {"g": [[1.0], [5.0]]}, {"g": [0, 1]})
    b = host_result([2], [7], {"g": [[2.0]]}, {"g": [0]})
    one = host_result([1, 2, 5], [3, 7, 4], {"g": [[1.0], [2.0], [5.0]]}, {"g": [0, 1, 2]})
    for batch in (merge_results([a, b]), merge_results([b, a]), merge_results([one])):
        assert batch.device_ids.tolist() == [1, 2, 5]
        assert batch.num_samples.tolist() == [3, 7, 4]
        assert batch.updates["g"].ravel().tolist() == [1.0, 2.0, 5.0]
        assert batch.senders["g"].tolist() == [0, 1, 2]
