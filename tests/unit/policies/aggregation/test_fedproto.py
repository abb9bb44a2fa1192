"""FedProto's server side (policies.aggregation.fedproto) by hand: a global prototype is the
plain mean over the devices that have the class; the uplink counts only the classes a device
holds."""

from __future__ import annotations

import numpy as np

from policies.aggregation.fedproto import FedProtoAggregation, average_prototypes
from raymm.protocol.messages import UpdateBatch


def test_global_prototype_is_the_plain_mean_over_devices_that_have_the_class() -> None:
    means = np.array([[[1.0, 1.0], [0.0, 0.0]],      # device 0: class 0 only
                      [[3.0, 5.0], [2.0, 2.0]],      # device 1: both
                      [[0.0, 0.0], [4.0, 0.0]]])     # device 2: class 1 only
    counts = np.array([[10, 0], [1, 1], [0, 7]])     # sample counts do not weigh
    protos, has = average_prototypes(means, counts, None, None)
    np.testing.assert_allclose(protos, [[2.0, 3.0], [3.0, 1.0]])
    assert has.tolist() == [True, True]
    # a class nobody reports keeps its prototype; a new report replaces it (no momentum)
    again, has2 = average_prototypes(means[:1], counts[:1], protos, has)
    np.testing.assert_allclose(again, [[1.0, 1.0], [3.0, 1.0]])
    assert has2.tolist() == [True, True]


def test_uplink_counts_only_the_classes_a_device_holds() -> None:
    agg = FedProtoAggregation(None)
    extras = {"proto_means/z": np.zeros((2, 3, 4), np.float32),
              "proto_counts/z": np.array([[5, 0, 1], [0, 0, 0]], np.int32)}
    b = UpdateBatch(np.arange(2), np.array([6, 1]), np.zeros(2), np.zeros(2), {}, {},
                    extras, np.zeros(0, np.int64), ())
    assert agg.extras_uplink_bytes(b).tolist() == [2 * (4 + 1) * 4, 0]
