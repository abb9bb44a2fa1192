"""FedAsync (policies.aggregation.fedasync): each arrival mixed in at once, with the paper's
staleness defaults."""

import numpy as np

from policies.aggregation.fedasync import FedAsync, FedAsyncParams
from policies.aggregation.fedbuff import FedBuffParams
from raymm.app.build import build_world, load_scenario
from raymm.protocol.asynchrony import discount

from helpers import async_arrivals, async_scenario


def test_each_discount_has_its_papers_defaults():
    """Xie et al. 2019's experiments: poly a = 0.5; hinge a = 10, b = 4, so
    f(6) = 1/(10·(6−4)+1) = 1/21, not the 1/(0.5·2+1) = 1/2 of poly's a."""
    s = np.array([0, 4, 5, 6])
    assert np.allclose(discount("poly", s), [1, 1 / np.sqrt(5), 1 / np.sqrt(6), 1 / np.sqrt(7)])
    assert np.allclose(discount("hinge", s), [1, 1, 1 / 11, 1 / 21])
    assert np.allclose(discount("constant", s), 1)
    hinge = FedAsyncParams(staleness="hinge")
    assert (hinge.staleness_a, hinge.staleness_b) == (10.0, 4.0)
    assert (FedBuffParams().staleness_a, FedBuffParams().staleness_b) == (0.5, None)
    assert FedAsyncParams(staleness="hinge", staleness_a=2).staleness_a == 2  # set: kept
    x = {"g": np.array([1.0, 2.0], np.float32)}
    new = FedAsync(hinge).apply(x, async_arrivals([[3, 3]], [[0, 0]], [6], [7]))
    a = 0.6 / 21
    assert np.allclose(new["g"], (1 - a) * x["g"] + a * np.array([3, 3]))
    sc = load_scenario(async_scenario("fedasync", aggregation={
        "name": "fedasync", "concurrency": 4, "staleness": "hinge"}))
    agg = build_world(sc).policies.aggregator.p                 # the preset pins no a
    assert (agg.staleness_a, agg.staleness_b) == (10.0, 4.0)


def test_fedasync_mixes_each_arrival():
    x = {"g": np.array([1.0, 2.0], np.float32), "other": np.array([5.0], np.float32)}
    arr = async_arrivals([[3, 3]], [[0, 0]], [3], [7])
    new = FedAsync(FedAsyncParams(alpha=0.6)).apply(x, arr)
    a = 0.6 / np.sqrt(4)
    assert np.allclose(new["g"], (1 - a) * x["g"] + a * np.array([3, 3]))
    assert new["other"] is x["other"]  # a group nobody sent keeps its vector
