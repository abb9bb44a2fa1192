"""The adaptive modality order: the decision rules and their bookkeeping on
hand-made observations, the schedule's phases, what travels, and the stage loss it drives."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from policies.objective.mcft import MCFTParams, MCFTStage
from policies.schedule.chain import PRECEDING, ModalityChain
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
from raymm.errors import ScenarioError
from raymm.models.network import ModelOutput
from raymm.protocol.observations import Observations
from raymm.protocol.seams import LossInputs, ModalityReport

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


def _sc(rounds: int, exchange: str = "params", every: int = 1) -> SimpleNamespace:
    return SimpleNamespace(rounds=rounds, model=SimpleNamespace(fusion="sum_logits"),
                           training=SimpleNamespace(exchange=exchange, sync_every=every))


def _obs(mask: np.ndarray) -> Observations:
    obs = Observations.register(mask, np.zeros(mask.shape[0], np.int64))
    obs.observe_online(np.arange(mask.shape[0]), np.full(mask.shape[0], 10))
    return obs


def test_adaptive_chain_schedule_phases_groups_reports_and_extras() -> None:
    chain = ModalityChain(ModalityChain.Params(order="adaptive", phases=3, rule="gain"))
    chain.bind(_sc(8), ("x", "y"))                   # probe 2 rounds, then 2 + 2 + 2
    assert chain.last.tolist() == [2, 4, 6, 8]
    groups = ["sensor:x", "sensor:y"]
    mask = np.array([[1, 0], [0, 1], [1, 1]], bool)
    obs = _obs(mask)
    chain.begin_round(1, obs)
    assert chain.phase(1) == "probe" and chain.active_groups(1, groups) == tuple(groups)
    assert chain.eligible(1, mask, ("x", "y")).all() and chain.frozen_groups(1) == ()
    assert chain.report_sensors(1) == ("x", "y") and chain.report_sensors(2) == ("x", "y")
    assert chain.report_sensors(3) == () and chain.extras(1)[PRECEDING].tolist() == [0, 0]
    for t in (1, 2):
        correct = np.array([[6 if t == 2 else 2, -1], [-1, 3], [5, 4]], np.int32)
        chain.observe(ModalityReport(t, np.arange(3), np.full(3, 10), correct))
    chain.begin_round(3, obs)                        # x gained 0.2 per round, y nothing
    assert chain.phase(3) == "x" and chain.active_groups(3, groups) == ("sensor:x",)
    assert chain.eligible(3, mask, ("x", "y")).tolist() == [True, False, True]
    assert chain.report_sensors(4) == ("x",)         # y is neither trained, frozen nor initial
    chain.begin_round(5, obs)
    assert chain.phase(5) == "y" and chain.frozen_groups(5) == ("sensor:x",)
    assert chain.extras(5)[PRECEDING].tolist() == [1, 0]
    assert chain.report_sensors(6) == ("x", "y")
    stats = chain.round_stats()
    assert stats["chain/phase"] == 2 and stats["chain/modality"] == 1
    assert stats["chain/score/x"] == -np.inf       # x already had its phase
    assert chain.phase_span(6) == (5, 6)


def test_fixed_chain_keeps_no_state_and_sends_nothing_extra() -> None:
    chain = ModalityChain(ModalityChain.Params(chain=["y", "x"]))
    chain.bind(_sc(4), ("x", "y"))
    assert [chain.phase(t) for t in range(1, 5)] == ["y", "y", "x", "x"]
    assert chain.extras(3) == {} and chain.report_sensors(1) == ()
    assert chain.state_dict() == {} and chain.round_stats() == {}


@pytest.mark.parametrize("params, rounds, message", [
    ({"order": "adaptive", "chain": ["x", "y"]}, 8, "drop schedule.chain"),
    ({"order": "adaptive", "probe_rounds": 6}, 8, "do not fit"),
    ({"order": "adaptive", "phases": 2, "rounds": [3, 2]}, 8, "add up to rounds - probe = 6"),
    ({"phases": 3}, 8, "schedule.phases: only used with order: adaptive"),
    ({"rule": "gain"}, 8, "schedule.rule: only used with order: adaptive"),
])
def test_bad_chain_parameters_are_named(params: dict, rounds: int, message: str) -> None:
    with pytest.raises(ScenarioError, match=message):
        ModalityChain(ModalityChain.Params(**params)).bind(_sc(rounds), ("x", "y"))


def _stage() -> MCFTStage:
    obj = MCFTStage(MCFTParams())
    obj.bind(SimpleNamespace(schedule=SimpleNamespace(
        name="modality_chain", params=lambda: {"order": "adaptive"})), ("a", "v"))
    return obj


def _inputs(groups: tuple[str, ...], extras: dict) -> tuple[LossInputs, dict]:
    g = torch.Generator().manual_seed(0)
    emb = {m: torch.randn(4, 3, generator=g, requires_grad=True) for m in ("a", "v")}
    logits = {m: torch.randn(4, 5, generator=g, requires_grad=True) for m in ("a", "v")}
    y = torch.tensor([0, 1, 2, 3])
    out = ModelOutput(logits["a"] + logits["v"], None, emb, logits)
    return LossInputs(out, y, torch.ones(4, 2), ("a", "v"), {}, {}, extras,
                      groups=groups), {"logits": logits, "y": y}


def test_probe_loss_trains_every_branch_on_its_own_cross_entropy() -> None:
    inp, t = _inputs(("sensor:a", "sensor:v"), {PRECEDING: torch.zeros(2)})
    loss = _stage().loss(inp)
    expected = sum(F.cross_entropy(t["logits"][m], t["y"]) for m in ("a", "v"))
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)


def test_stage_loss_takes_the_predecessors_from_the_broadcast() -> None:
    fixed = MCFTStage(MCFTParams())                  # the fixed chain v -> a
    fixed.bind(SimpleNamespace(schedule=SimpleNamespace(
        name="modality_chain", params=lambda: {"chain": ["v", "a"]})), ("a", "v"))
    inp, _ = _inputs(("sensor:a",), {})
    expected = fixed.loss(inp).item()
    # the sensor order (a, v) would make a the first phase; the broadcast says v came first
    inp, t = _inputs(("sensor:a",), {PRECEDING: torch.tensor([0.0, 1.0])})
    assert _stage().loss(inp).item() == pytest.approx(expected, rel=1e-6)
    assert expected != pytest.approx(F.cross_entropy(t["logits"]["a"], t["y"]).item())
    inp, t = _inputs(("sensor:v",), {PRECEDING: torch.tensor([0.0, 0.0])})
    assert _stage().loss(inp).item() == pytest.approx(
        F.cross_entropy(t["logits"]["v"], t["y"]).item())


def test_a_fixed_chain_may_open_with_the_probe_too() -> None:
    """The ablation that tells the order's effect from the probe's: the same probe, then the
    fixed chain; nothing is reported, nothing extra is sent."""
    chain = ModalityChain(ModalityChain.Params(chain=["y", "x"], probe_rounds=2))
    chain.bind(_sc(8), ("x", "y"))
    groups = ["sensor:x", "sensor:y"]
    assert [chain.phase(t) for t in range(1, 9)] == ["probe"] * 2 + ["y"] * 3 + ["x"] * 3
    assert chain.active_groups(2, groups) == tuple(groups) and chain.frozen_groups(2) == ()
    assert chain.frozen_groups(6) == ("sensor:y",)
    assert chain.report_sensors(1) == () and chain.extras(1) == {}
    with pytest.raises(ScenarioError, match="less the probe's 2"):
        ModalityChain(ModalityChain.Params(rounds=[4, 4], probe_rounds=2)).bind(
            _sc(8), ("x", "y"))


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
