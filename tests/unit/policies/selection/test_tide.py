"""TIDE's selection (policies.selection.tide) by hand: the score, top-K and ties, the
participation term; its adaptive weights: the reward and the selector on hand-made
observations; bad adaptive settings (weights and chain order) fail validation."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml
from pydantic import ValidationError

from policies.selection.tide import (
    AdaptiveWeights,
    TideParticipationSelection,
    TideSelection,
    TideSelectionParams,
    tide_scores,
    tier_sizes,
    top_k,
    window_reward,
)
from raymm.app.cli import main
from raymm.protocol.observations import Observations
from raymm.protocol.seams import EvalFeedback, SelectionContext

from helpers import REPO, tide_observations, tiny_scenario

GIB = 1 << 30


def test_window_reward_is_the_share_of_the_remaining_error_removed_per_unit_cost() -> None:
    assert window_reward(0.5, 0.6, 0.5) == pytest.approx(0.4)    # 0.1 / 0.5 / 0.5
    assert window_reward(0.9, 0.92, 2.0) == pytest.approx(0.1)   # 0.02 / 0.1 / 2
    assert window_reward(0.8, 0.7, 1.0) == pytest.approx(-0.5)


def fb(t: int, acc: float, gib: float, seconds: float = 0.0) -> EvalFeedback:
    return EvalFeedback(t, acc, int(gib * GIB), seconds)


def test_adaptive_weights_reward_each_window_per_gib_and_skip_free_windows() -> None:
    w = AdaptiveWeights(np.array([[1.0, 0, 0, 0], [0, 1.0, 0, 0]]), "gib", 0.9, 0.5)
    assert w.arm == 0
    w.observe(fb(10, 0.5, 1.0))          # the first window has no accuracy to gain from
    assert not w.bandit.played.any() and w.arm == 0
    w.observe(fb(20, 0.6, 2.0))          # arm 0: 0.1 / 0.5 / 1 GiB
    assert w.bandit.sums[0] == pytest.approx(0.2) and w.arm == 1
    w.observe(fb(30, 0.6, 2.0))          # nothing sent: no reward, arm 1 still untried
    assert not w.bandit.played[1] and w.arm == 1
    w.observe(fb(40, 0.7, 4.0))          # arm 1: 0.1 / 0.4 / 2 GiB
    np.testing.assert_allclose(w.bandit.sums, [0.18, 0.125])
    # values: 0.18/0.9/0.2 + 0.5·sqrt(log 1.9/0.9) = 1.42 against 0.625 + 0.40 = 1.03
    assert w.arm == 0
    again = AdaptiveWeights(w.arms, "gib", 0.9, 0.5)
    again.load_state_dict(w.state_dict())
    assert again.arm == 0 and again.bandit.values().tolist() == w.bandit.values().tolist()


def test_adaptive_weights_can_pay_in_simulated_seconds() -> None:
    w = AdaptiveWeights(np.array([[1.0, 0, 0, 0], [0, 1.0, 0, 0]]), "seconds", 0.9, 0.5)
    w.observe(fb(10, 0.5, 1.0, seconds=100.0))
    w.observe(fb(20, 0.75, 9.0, seconds=150.0))
    assert w.bandit.sums[0] == pytest.approx(0.5 / 50.0)


def _obs() -> Observations:
    mask = np.array([[1, 1], [1, 0], [1, 0], [0, 1], [0, 1], [0, 1]], bool)
    obs = Observations.register(mask, np.zeros(6, np.int64))
    obs.observe_online(np.arange(6), np.array([100, 20, 80, 50, 60, 10]))
    obs.observe_trained(np.arange(6), np.array([1.0, 0.1, 3.0, 0.5, 2.0, 0.2]))
    return obs


def _ctx(obs: Observations, k: int = 2) -> SelectionContext:
    ids = np.arange(6)
    return SelectionContext(5, ids, ids, k, obs, np.random.default_rng(0))


def test_selection_uses_the_arm_in_play_and_logs_its_weights() -> None:
    arms = [[1.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0]]
    sel = TideSelection(TideSelectionParams(weights="adaptive", arms=arms))
    obs = _obs()
    # arm 0 is speed only: the two fastest devices (0.1 s and 0.2 s)
    np.testing.assert_array_equal(sel.select(_ctx(obs)), [1, 5])
    assert sel.round_stats() == {"selection/arm": 0, "selection/alpha": 1.0,
                                 "selection/beta": 0.0, "selection/gamma": 0.0,
                                 "selection/participation": 0.0}
    sel.observe_evaluation(fb(10, 0.5, 1.0))
    sel.observe_evaluation(fb(20, 0.6, 2.0))       # arm 0 rewarded: arm 1 (data size) next
    np.testing.assert_array_equal(sel.select(_ctx(obs)), [0, 2])
    assert sel.round_stats()["selection/arm"] == 1


def test_fixed_weights_select_exactly_as_before_and_keep_no_state() -> None:
    sel = TideSelection(TideSelectionParams())
    obs = _obs()
    ids = np.arange(6)
    expected = top_k(ids, tide_scores(obs, ids, 0.25, 0.35, 0.25), 3)
    np.testing.assert_array_equal(sel.select(_ctx(obs, 3)), expected)
    sel.observe_evaluation(fb(10, 0.5, 1.0))
    assert sel.round_stats() == {} and sel.state_dict() == {}


def test_default_arms_start_from_the_configured_weights() -> None:
    arms = TideSelectionParams(weights="adaptive", participation=0.15).weight_arms()
    np.testing.assert_allclose(arms, [[0.25, 0.35, 0.25, 0.15], [0.55, 0.15, 0.15, 0.15],
                                      [0.15, 0.55, 0.15, 0.15], [0.15, 0.15, 0.55, 0.15],
                                      [0.25, 0.35, 0.25, 0.0]])


@pytest.mark.parametrize("params, message", [
    ({"weights": "adaptive", "arms": [[1, 2]]}, "four finite numbers"),
    ({"weights": "adaptive", "arms": [[0, 0, 0, 0]]}, "not all zero"),
    ({"weights": "adaptive", "arms": [[1, -1, 0, 0]]}, "≥ 0"),
    ({"arms": [[1, 1, 1, 0]]}, "only used with weights: adaptive"),
    ({"weights": "adaptive", "discount": 0}, "greater than 0"),
    ({"weights": "bandit"}, "'fixed' or 'adaptive'"),
])
def test_bad_weight_settings_are_rejected_with_a_reason(params: dict, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        TideSelectionParams(**params)


@pytest.mark.parametrize("settings, message", [
    (["selection.weights=adaptiv"], "selection.weights: Input should be 'fixed' or 'adaptive'"),
    (["selection.weights=adaptive", "selection.arms=[[1,2]]"],
     "selection.arms: Value error, arm 0 is [1.0, 2.0]"),
    (["selection.arms=[[1,2,3,4]]"], "selection.arms: Value error, only used with weights"),
    (["selection.weights=adaptive", "selection.reward=money"],
     "selection.reward: Input should be 'gib' or 'seconds'"),
    (["schedule.order=random"], "schedule.order: Input should be 'fixed' or 'adaptive'"),
    (["schedule.order=adaptive", "schedule.chain=[dom,mid]"], "drop schedule.chain"),
    (["schedule.order=adaptive", "schedule.probe_rounds=12"], "schedule.phases: the probe"),
    (["schedule.rule=gain"], "schedule.rule: only used with order: adaptive"),
])
def test_bad_adaptive_settings_fail_validation_with_the_field_named(
        settings: list[str], message: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    if settings[0].startswith("selection"):
        path = tmp_path / "tide.yaml"
        path.write_text(yaml.safe_dump(tiny_scenario(method="tide",
                                                     selection={"name": "tide", "k": 5})))
    else:
        path = REPO / "scenarios" / "fedmchain_synthetic.yaml"
    args = ["validate", str(path)]
    for s in settings:
        args += ["--set", s]
    assert main(args) == 2
    assert message in capsys.readouterr().err


# --- the score, by hand -------------------------------------------------------------------


def test_score_by_hand() -> None:
    # v = [1/3, 1/4, .5, .5, .5]; eta = [.5, .25, 1, .5, 0]; rho = [1, 1/3, 1/3, 1, 1/3]
    u = tide_scores(tide_observations(), np.arange(5), 0.25, 0.35, 0.25)
    expected = [0.25 / 3 + 0.175 + 0.25, 0.0625 + 0.0875 + 0.25 / 3, 0.125 + 0.35 + 0.25 / 3,
                0.125 + 0.175 + 0.25, 0.125 + 0.0 + 0.25 / 3]
    np.testing.assert_allclose(u, expected, rtol=1e-12)
    assert tier_sizes(tide_observations().sensor_mask).tolist() == [1, 3, 3, 1, 3]


def ctx(obs: Observations, eligible: list[int], k: int, t: int = 1) -> SelectionContext:
    return SelectionContext(t, np.arange(obs.n), np.array(eligible), k, obs,
                            np.random.default_rng(0))


def test_selection_top_k_and_fewer_online_than_k() -> None:
    sel = TideSelection(TideSelectionParams())
    assert sel.select(ctx(tide_observations(), [0, 1, 2, 3, 4], 2)).tolist() == [2, 3]
    assert sel.select(ctx(tide_observations(), [0, 1, 2, 3, 4], 3)).tolist() == [0, 2, 3]
    assert sel.select(ctx(tide_observations(), [1, 4], 3)).tolist() == [1, 4]
    assert sel.select(ctx(tide_observations(), [0, 1, 4], 2)).tolist() == [0, 1]


def test_ties_go_to_the_smaller_id() -> None:
    ids, scores = np.array([7, 3, 5, 9]), np.array([0.5, 0.7, 0.5, 0.5])
    assert top_k(ids, scores, 2).tolist() == [3, 5]
    assert top_k(ids, scores, 3).tolist() == [3, 5, 7]
    # two devices identical in every observation: the smaller id wins
    mask = np.ones((3, 2), dtype=bool)
    obs = Observations.register(mask, np.zeros(3, int))
    obs.observe_online(np.arange(3), np.array([10, 10, 10]))
    assert TideSelection(TideSelectionParams()).select(ctx(obs, [0, 1, 2], 2)).tolist() == [0, 1]


def test_participation_term_rewards_recent_selection() -> None:
    obs = tide_observations()
    for t in range(1, 6):  # device 4 selected in 5 of the last 10 rounds
        obs.observe_selected(t, np.array([4]))
    base = tide_scores(obs, np.arange(5), 0.25, 0.35, 0.25)
    u = tide_scores(obs, np.arange(5), 0.25, 0.35, 0.25, participation=0.15)
    np.testing.assert_allclose(u - base, [0, 0, 0, 0, 0.15 * 0.5], atol=1e-15)
    assert TideParticipationSelection.Params().participation == 0.15
    # 0.5583 (dev 2) > 0.55 (dev 3) > 0.5083 (dev 0) > 0.2833 (dev 4) > 0.2333 (dev 1)
    sel = TideParticipationSelection(TideParticipationSelection.Params())
    assert sel.select(ctx(obs, [0, 1, 2, 3, 4], 4)).tolist() == [0, 2, 3, 4]
    assert sel.select(ctx(obs, [1, 4], 1)).tolist() == [4]
    assert TideSelection(TideSelectionParams()).select(ctx(obs, [1, 4], 1)).tolist() == [1]
