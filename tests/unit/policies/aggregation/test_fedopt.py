"""FedAdagrad, FedAdam, FedYogi: one server step by hand, moments carried over rounds, the
periodic twin, groups nobody sent, and the state a checkpoint holds."""

from __future__ import annotations

import numpy as np
import pytest

from policies.aggregation.fedopt import (
    FedAdagrad,
    FedAdagradParams,
    FedAdam,
    FedAdamDelta,
    FedOptParams,
    FedYogi,
    server_step,
)
from raymm.protocol.messages import UpdateBatch
from raymm.protocol.observations import Observations
from raymm.protocol.seams import AggregationContext

P = FedOptParams(eta=0.1, beta1=0.9, beta2=0.99, tau=0.01)


def batch(rows: dict[str, np.ndarray], samples: list[int]) -> UpdateBatch:
    n = len(samples)
    return UpdateBatch(np.arange(n), np.array(samples), np.zeros(n), np.zeros(n),
                       {g: np.asarray(r, np.float32) for g, r in rows.items()},
                       {g: np.arange(n) for g in rows}, {}, np.zeros(0, np.int64), ())


CTX = AggregationContext(1, ("a",), Observations.register(np.ones((2, 1), bool),
                                                          np.zeros(2, np.int64)), 0)


def test_first_adam_step_by_hand() -> None:
    # Δ = [0.2, -0.1]; m = 0.1Δ = [0.02, -0.01]; v = 0.99·τ² + 0.01·Δ² = [0.000499, 0.000199]
    x, delta = np.array([1.0, 1.0], np.float32), np.array([0.2, -0.1])
    new, m, v = server_step("adam", x, delta, None, None, P)
    np.testing.assert_allclose(m, [0.02, -0.01])
    np.testing.assert_allclose(v, [0.000499, 0.000199])
    step = 0.1 * m / (np.sqrt(v) + 0.01)   # √v = [0.022338, 0.014107]: [0.061846, -0.041482]
    np.testing.assert_allclose(new, 1.0 + step, rtol=1e-6)
    np.testing.assert_allclose(new, [1.061846, 0.958518], rtol=1e-5)


def test_second_moment_rules_by_hand() -> None:
    x = np.zeros(2, np.float32)
    m0, v0, delta = np.array([0.1, 0.0]), np.array([0.05, 0.001]), np.array([0.1, 0.1])
    # Δ² = 0.01 for both: coordinate 0 has v > Δ², coordinate 1 has v < Δ²
    _, _, v_ada = server_step("adagrad", x, delta, m0, v0, P)
    np.testing.assert_allclose(v_ada, [0.06, 0.011])
    _, _, v_adam = server_step("adam", x, delta, m0, v0, P)
    np.testing.assert_allclose(v_adam, [0.99 * 0.05 + 0.0001, 0.99 * 0.001 + 0.0001])
    _, m, v_yogi = server_step("yogi", x, delta, m0, v0, P)
    # Yogi: v - 0.01·Δ²·sign(v - Δ²) = [0.05 - 0.0001, 0.001 + 0.0001]
    np.testing.assert_allclose(v_yogi, [0.0499, 0.0011])
    np.testing.assert_allclose(m, [0.9 * 0.1 + 0.01, 0.01])


@pytest.mark.parametrize("cls,rule", [(FedAdagrad, "adagrad"), (FedAdam, "adam"),
                                      (FedYogi, "yogi")])
def test_aggregator_steps_on_the_weighted_mean_update_and_keeps_moments(cls, rule) -> None:
    agg = cls(P)
    params = {"a": np.array([1.0, 2.0], np.float32), "b": np.array([5.0], np.float32)}
    # weighted mean of the uploads (1:3) = [2.125, 1.0]; Δ = [1.125, -1.0]; "b" sent by nobody
    b1 = batch({"a": [[4.0, -2.0], [1.5, 2.0]]}, [1, 3])
    out = agg.aggregate(params, b1, CTX)
    want, m, v = server_step(rule, params["a"], np.array([1.125, -1.0]), None, None, P)
    np.testing.assert_array_equal(out["a"], want)
    assert out["b"] is params["b"] and "b" not in agg.m
    # the second round starts from the kept moments
    out2 = agg.aggregate(out, batch({"a": [[0.0, 0.0], [0.0, 0.0]]}, [1, 1]), CTX)
    want2, _, _ = server_step(rule, out["a"], -out["a"].astype(np.float64), m, v, P)
    np.testing.assert_array_equal(out2["a"], want2)
    assert agg.steps == {"a": 2}
    np.testing.assert_array_equal(params["a"], [1.0, 2.0])   # inputs untouched


def test_periodic_twin_takes_the_mean_delta_as_the_pseudo_gradient() -> None:
    params = {"a": np.array([1.0, 2.0], np.float32)}
    trained = batch({"a": [[4.0, -2.0], [1.5, 2.0]]}, [1, 3])
    deltas = batch({"a": [[3.0, -4.0], [0.5, 0.0]]}, [1, 3])   # the same uploads minus x
    a = FedAdam(P).aggregate(params, trained, CTX)
    b = FedAdamDelta(P).aggregate(params, deltas, CTX)
    np.testing.assert_allclose(a["a"], b["a"], rtol=1e-6)
    assert FedAdamDelta.takes_deltas and not FedAdam.takes_deltas


def test_state_round_trip_continues_identically() -> None:
    params = {"a": np.array([1.0, 2.0], np.float32)}
    b = batch({"a": [[4.0, -2.0], [1.5, 2.0]]}, [1, 3])
    ref = FedYogi(P)
    mid = ref.aggregate(params, b, CTX)
    saved = ref.state_dict()
    end = ref.aggregate(mid, b, CTX)
    fresh = FedYogi(P)
    fresh.load_state_dict(saved)
    np.testing.assert_array_equal(fresh.aggregate(mid, b, CTX)["a"], end["a"])
    saved["m"]["a"][:] = 99.0      # the checkpoint was a copy, not the live moments
    assert not np.any(ref.m["a"] == 99.0)


def test_paper_defaults_are_fields() -> None:
    p = FedOptParams()
    assert (p.beta1, p.beta2, p.tau, p.eta) == (0.9, 0.99, 1e-3, 1e-2)
    assert FedAdagradParams().eta == 1e-1
    assert FedAdagrad(None).p.eta == 1e-1 and FedAdam(None).p.eta == 1e-2
