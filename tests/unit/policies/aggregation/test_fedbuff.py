"""FedBuff (policies.aggregation.fedbuff): the server step on a full buffer."""

import numpy as np

from policies.aggregation.fedbuff import FedBuff, FedBuffParams

from helpers import async_arrivals


def test_fedbuff_step_is_the_discounted_weighted_mean_delta():
    x = {"g": np.array([1.0, 2.0], np.float32)}
    arr = async_arrivals([[2, 2], [1, 4], [0, 0]], [[1, 2], [1, 2], [2, 2]], [0, 3, 1],
                         [10, 30, 20])
    new = FedBuff(FedBuffParams(concurrency=4, buffer=3, server_lr=0.5)).apply(x, arr)
    f = 1 / np.sqrt(1 + np.array([0, 3, 1]))
    w = np.array([10, 30, 20])
    d = np.array([[1, 0], [0, 2], [-2, -2]])
    assert np.allclose(new["g"], x["g"] + 0.5 * (w * f) @ d / w.sum())
    assert new["g"].dtype == np.float32


def test_fedbuff_without_staleness_is_fedavg():
    x = {"g": np.array([1.0, 2.0], np.float32)}
    trained = [[2, 2], [1, 4], [0, 0]]
    arr = async_arrivals(trained, [x["g"]] * 3, [0, 0, 0], [10, 30, 20])
    new = FedBuff(FedBuffParams(concurrency=3, buffer=3)).apply(x, arr)
    assert np.allclose(new["g"], np.average(trained, axis=0, weights=[10, 30, 20]))
