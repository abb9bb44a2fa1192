"""FLISM's server (policies.aggregation.flism), by hand: the main model weighted by 1/H_i
(modality quality-aware aggregation), the teacher the unweighted mean of the same uploads,
broadcast with the next round and kept across a checkpoint; the delta twin."""

from __future__ import annotations

import numpy as np
import pytest

from policies.aggregation.flism import FlismAggregator, FlismDelta, entropy_weights
from policies.objective.flism import ENTROPY, TEACHER
from raymm.protocol.messages import merge_results
from raymm.protocol.seams import AggregationContext

from helpers import host_result

CTX = AggregationContext(1, ("a",), None, 0)  # type: ignore[arg-type]


def _batch(rows: list[list[float]], entropies: list[float]):  # type: ignore[no-untyped-def]
    """Devices 3 and 8 (sample counts 10 and 90, which FLISM ignores) send group "g"."""
    res = host_result([3, 8], [10, 90], {"g": rows}, {"g": [0, 1]})
    res.extras[ENTROPY] = np.array(entropies, np.float32)[:, None]
    return merge_results([res])


def test_entropy_weighted_main_model_and_plain_mean_teacher() -> None:
    # H = (0.5, 1.0) -> weights 1/H = (2, 1), i.e. (2/3, 1/3); uploads 1 and 4
    batch = _batch([[1.0], [4.0]], [0.5, 1.0])
    params = {"g": np.array([0.0], np.float32), "k": np.array([7.0], np.float32)}
    agg = FlismAggregator(None)
    assert not agg.combinable and agg.extras(1) == {}   # no teacher before any upload
    out = agg.aggregate(params, batch, CTX)
    np.testing.assert_allclose(out["g"], [2.0], rtol=1e-6)   # (2·1 + 1·4) / 3
    np.testing.assert_array_equal(out["k"], [7.0])           # nobody sent it
    sent = agg.extras(2)
    np.testing.assert_allclose(sent[TEACHER + "g"], [2.5], rtol=1e-6)   # (1 + 4) / 2
    np.testing.assert_array_equal(sent[TEACHER + "k"], [7.0])
    assert params["g"].tolist() == [0.0]


def test_teacher_survives_a_round_without_uploads_and_a_checkpoint() -> None:
    agg = FlismAggregator(None)
    params = {"g": np.array([0.0], np.float32)}
    agg.aggregate(params, _batch([[1.0], [4.0]], [0.5, 1.0]), CTX)
    empty = merge_results([host_result([3], [10], {}, {})])
    agg.aggregate({"g": np.array([2.0], np.float32)}, empty, CTX)   # between syncs
    fresh = FlismAggregator(None)
    fresh.load_state_dict(agg.state_dict())
    np.testing.assert_allclose(fresh.extras(3)[TEACHER + "g"], [2.5], rtol=1e-6)


def test_delta_twin_adds_the_weighted_and_the_plain_mean_change() -> None:
    # the server holds 10; deltas -9 and -6 are uploads 1 and 4 taken against it
    agg = FlismDelta(None)
    assert agg.takes_deltas
    out = agg.aggregate({"g": np.array([10.0], np.float32)},
                        _batch([[-9.0], [-6.0]], [0.5, 1.0]), CTX)
    np.testing.assert_allclose(out["g"], [2.0], rtol=1e-6)
    np.testing.assert_allclose(agg.extras(2)[TEACHER + "g"], [2.5], rtol=1e-6)


def test_a_zero_entropy_gets_a_finite_weight() -> None:
    w = entropy_weights(np.array([0.0, 2.0]))
    assert np.isfinite(w).all() and w[1] == pytest.approx(0.5)
