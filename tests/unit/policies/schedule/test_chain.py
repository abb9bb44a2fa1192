"""The modality chain (policies.schedule.chain): fixed and adaptive orders, their phases,
eligibility, active and frozen groups, what is reported and sent, and the parameters it
refuses."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from policies.schedule.chain import PRECEDING, ModalityChain, phase_lengths
from raymm.errors import ScenarioError
from raymm.protocol.observations import Observations
from raymm.protocol.seams import ModalityReport


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


def test_chain_schedule_phases_eligibility_and_groups() -> None:
    chain = ModalityChain(ModalityChain.Params())
    chain.bind(SimpleNamespace(rounds=7, model=SimpleNamespace(fusion="sum_logits")),
               ("x", "y", "z"))
    assert phase_lengths(7, 3) == [3, 2, 2]
    assert [chain.phase(t) for t in range(1, 8)] == ["x"] * 3 + ["y"] * 2 + ["z"] * 2
    assert chain.active_groups(4, ["sensor:x", "sensor:y", "sensor:z"]) == ("sensor:y",)
    assert chain.phase_span(5) == (4, 5) and chain.preceding("z") == ("x", "y")
    mask = np.array([[1, 0, 1], [0, 1, 1], [1, 1, 0]], bool)
    np.testing.assert_array_equal(chain.eligible(4, mask, ("x", "y", "z")), [False, True, True])
    with pytest.raises(ScenarioError, match="not among"):
        ModalityChain(ModalityChain.Params(chain=["x", "w"])).bind(
            SimpleNamespace(rounds=4, model=SimpleNamespace(fusion="sum_logits")), ("x", "y"))
    with pytest.raises(ScenarioError, match="sum_logits"):
        ModalityChain(ModalityChain.Params()).bind(
            SimpleNamespace(rounds=4, model=SimpleNamespace(fusion="concat")), ("x", "y"))
