"""The adaptive modality order (policies.schedule.order): the decision rules and their
bookkeeping on hand-made observations, and what travels in an adaptive run."""

from __future__ import annotations

import numpy as np
import pytest

from policies.schedule.order import (
    PROBE,
    AdaptiveOrder,
    GainRule,
    ModalityState,
    WeakestRule,
    data_share,
    pick,
    sync_rounds,
)
from raymm.protocol.seams import ModalityReport

NAN = float("nan")


def state(acc, gain, share) -> ModalityState:
    return ModalityState(np.array(acc, float), np.array(gain, float), np.array(share, float))


def test_gain_rule_weighs_the_learning_rate_by_the_data_served_and_explores_unknowns() -> None:
    s = state([0.5, 0.4, 0.2], [0.1, 0.3, NAN], [1.0, 0.25, 0.5])
    np.testing.assert_allclose(GainRule().scores(s), [0.1, 0.075, np.inf])
    assert pick(GainRule().scores(s), s) == 2
    s = state([0.5, 0.4, 0.2], [0.1, 0.3, 0.1], [1.0, 0.25, 0.5])
    assert pick(GainRule().scores(s), s) == 0        # 0.1 > 0.075 > 0.05


def test_weakest_rule_picks_the_lowest_accuracy_and_treats_unreported_as_zero() -> None:
    s = state([0.5, 0.3, 0.7], [NAN] * 3, [1 / 3] * 3)
    assert pick(WeakestRule().scores(s), s) == 1
    s = state([0.5, NAN, 0.2], [NAN] * 3, [1 / 3] * 3)
    assert pick(WeakestRule().scores(s), s) == 1


def test_ties_go_to_lower_accuracy_then_larger_share_then_earlier_sensor() -> None:
    scores = np.array([1.0, 1.0, 1.0])
    assert pick(scores, state([0.5, 0.4, 0.6], [0] * 3, [0.2] * 3)) == 1
    assert pick(scores, state([0.5, 0.5, 0.5], [0] * 3, [0.2, 0.3, 0.3])) == 1
    assert pick(scores, state([0.5] * 3, [0] * 3, [0.2] * 3)) == 0


def test_data_share_counts_only_devices_heard_of() -> None:
    mask = np.array([[1, 0], [1, 1], [0, 1], [0, 1]], bool)
    n = np.array([10, 30, 60, -1])            # device 3 never reported its data size
    np.testing.assert_allclose(data_share(mask, n), [0.4, 0.9])
    np.testing.assert_allclose(data_share(mask, np.full(4, -1)), [0.5, 0.5])


def test_sync_rounds_map_every_round_to_the_sync_closing_its_window() -> None:
    is_sync = [False, True, False, False, True, False]   # rounds 1..6; round 6 never synced
    np.testing.assert_array_equal(sync_rounds(6, is_sync)[1:], [2, 2, 5, 5, 5, 7])


def test_modality_report_pools_samples_over_the_devices_that_reported() -> None:
    rep = ModalityReport(4, np.array([1, 5]), np.array([10, 30]),
                         np.array([[5, -1, -1], [15, 3, -1]], np.int32))
    np.testing.assert_allclose(rep.accuracy(), [20 / 40, 3 / 30, NAN])


def _order(rule: str = "gain") -> AdaptiveOrder:
    # probe rounds 1-2, then four phases of two rounds; every round is a sync (υ = 1)
    spans = [(1, 2), (3, 4), (5, 6), (7, 8), (9, 10)]
    return AdaptiveOrder(("a", "b", "c"), rule, spans, True, sync_rounds(10, [True] * 10))


def test_adaptive_order_by_hand() -> None:
    o = _order()
    share = np.array([0.5, 0.5, 1.0])
    o.observe(1, np.array([0.25, 0.25, 0.125]))     # the initial model: references
    assert np.isnan(o.gain_rate).all()
    o.observe(2, np.array([0.75, 0.375, 0.1875]))   # reflects round 1 of the probe
    np.testing.assert_allclose(o.gain_rate, [0.5, 0.125, 0.0625])
    assert o.decide(1, share) == 0                  # 0.25 > 0.0625 = 0.0625
    np.testing.assert_array_equal(o.preceding(1), [False, False, False])
    assert o.seen(4).tolist() == [3, 2, 2]
    o.observe(4, np.array([0.875, NAN, NAN]))       # a: (0.875 - 0.75) / (3 - 1)
    assert o.gain_rate[0] == 0.0625
    # every modality gets a phase first: b and c tie at 0.0625, c has the lower accuracy
    assert o.decide(2, share) == 2
    np.testing.assert_array_equal(o.scores[2], [-np.inf, 0.0625, 0.0625])
    np.testing.assert_array_equal(o.preceding(2), [True, False, False])
    o.observe(6, np.array([0.875, NAN, 0.4375]))
    np.testing.assert_allclose(o.gain_rate, [0.125 / 3, 0.125, 0.125])  # a over 3 rounds
    assert o.decide(3, share) == 1                  # the last one not yet trained in a phase
    o.observe(8, np.array([0.875, 0.5, 0.5]))
    np.testing.assert_allclose(o.gain_rate, [0.125 / 3, 0.0625, 0.3125 / 3])
    assert o.decide(4, share) == 2                  # a revisit: 0.104 > 0.031 > 0.021
    np.testing.assert_array_equal(o.preceding(4), [True, True, False])
    assert o.kinds.tolist() == [PROBE, 0, 2, 1, 2]
    assert o.decide(4, np.zeros(3)) == 2            # decided once


def test_a_phase_whose_training_does_not_show_yet_keeps_its_reference_fresh() -> None:
    # υ = 2 without probe: phase 1 = rounds 1-2 (sync at 2), phase 2 = rounds 3-4
    o = AdaptiveOrder(("a", "b"), "gain", [(1, 2), (3, 4)], False,
                      sync_rounds(4, [False, True, False, True]))
    assert o.decide(0, np.array([0.5, 0.5])) == 0   # nothing known: the earlier sensor
    o.observe(1, np.array([0.2, 0.25]))
    o.observe(2, np.array([0.22, NAN]))             # round 1's training not synced yet
    assert np.isnan(o.gain_rate).all() and o.ref_acc[0] == pytest.approx(0.22)
    assert o.untouched(1).tolist() == [False, True]


def test_adaptive_order_state_round_trip() -> None:
    o = _order("weakest")
    o.observe(1, np.array([0.2, 0.3, 0.1]))
    o.decide(1, np.ones(3) / 3)
    o2 = _order("weakest")
    o2.load_state_dict(o.state_dict())
    for k, v in o.state_dict().items():
        np.testing.assert_array_equal(getattr(o2, k), v)
    assert o2.kinds[1] == 2


def test_traffic_of_an_adaptive_run_by_hand() -> None:
    """Every round: a selected device receives the groups it trains, the predecessor mask, and
    each predecessor it holds once per version (a revisited modality is sent again once it
    changed); it sends its trained groups and, in report rounds, 4 bytes per reported sensor."""
    from raymm.app.build import build_world, load_scenario
    from raymm.sim.serial import SerialExecutor

    from helpers import REPO

    sc = load_scenario(REPO / "scenarios" / "fedmchain_synthetic.yaml", [
        "rounds=14", "schedule.order=adaptive", "schedule.probe_rounds=2", "schedule.phases=6",
        "training.sync_every=1", "eval.every=14"])
    world = build_world(sc)
    ex = SerialExecutor(devices_per_host=7)
    ex.start(world)
    sizes, mask = ex.server.layout.sizes, world.population.sensor_mask
    sensors = world.population.sensors
    current: set[tuple[int, str]] = set()     # (device, group): holds the server's version
    for t in range(1, sc.rounds + 1):
        plan, bcast = ex.plan(t, ex.poll(t))
        for g in plan.active_groups:
            current -= {(d, h) for d, h in current if h == g}
        frozen = ex.server.policies.schedule.frozen_groups(t)
        down = up = 0
        for d in plan.selected.tolist():
            held = [f"sensor:{m}" for m, h in zip(sensors, mask[d]) if h]
            down += sum(sizes[g] * 4 for g in plan.active_groups if g in held) + 4 * len(sensors)
            for g in frozen:
                if g in held and (d, g) not in current:
                    current.add((d, g))
                    down += sizes[g] * 4
            up += sum(sizes[g] * 4 for g in plan.active_groups if g in held)
            up += 4 * sum(1 for m, h in zip(sensors, mask[d]) if h and m in plan.report)
        stats = ex.aggregate(t, (plan, bcast), ex.train(t, (plan, bcast))).row
        assert (stats["bytes_down"], stats["bytes_up"]) == (down, up), t
    order = [ex.server.policies.schedule.phase(t) for t in range(1, sc.rounds + 1, 2)]
    assert len(set(order[1:])) < len(order[1:])   # six phases over three modalities revisit
