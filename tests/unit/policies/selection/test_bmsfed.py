"""BMSFed's balanced selection (policies.selection.bmsfed): stochastic greedy facility
location over update distances, by hand, and the weak-modality instruction."""

from __future__ import annotations

import numpy as np

from policies.aggregation.bmsfed import DIST, KNOWN, RATIO
from policies.selection.bmsfed import BMSFedSelection, BMSFedSelectionParams, balanced_greedy
from raymm.app.build import load_scenario
from raymm.config.schema import Scenario
from raymm.protocol.observations import Observations
from raymm.protocol.seams import SelectionContext

from helpers import tiny_scenario


def bmsfed_scenario() -> Scenario:
    """A two-sensor scenario of BMSFed's policies, its selection included."""
    return load_scenario(tiny_scenario(method="bmsfed", **{"selection.name": "bmsfed"}))


def _dist(g: np.ndarray) -> np.ndarray:
    return np.linalg.norm(g[:, None, :] - g[None, :, :], axis=2)


def test_greedy_by_hand() -> None:
    # g = (0,0), (1,0), (10,0): column sums of D = 11, 10, 19 -> device 2; then
    # Σ_j min(d_j, D_jr) = 9 (r = 1) vs 1 (r = 3) -> device 3: S = {2, 3} (1-based)
    d = _dist(np.array([[0.0, 0.0], [1.0, 0.0], [10.0, 0.0]]))
    picked, weak = balanced_greedy(d, d, np.zeros(3, bool), 2, 1.0, np.random.default_rng(0))
    assert picked.tolist() == [1, 2] and not weak.any()


def test_a_weak_pick_beyond_tau_trains_the_weak_modality_alone() -> None:
    d = _dist(np.array([[0.0, 0.0], [1.0, 0.0], [10.0, 0.0]]))
    wins = np.array([False, True, False])
    picked, weak = balanced_greedy(d, d, wins, 2, 1.0, np.random.default_rng(0))
    # the first weak-modality pick is device 2 (wins): taken as a weak pick; the multimodal
    # running minimum is still empty, so the next multimodal pick is the best of {1, 3}
    assert picked.tolist() == [1, 0] and weak.tolist() == [True, False]


def _ctx(published: dict, k: int) -> SelectionContext:
    mask = np.array([[1, 1], [1, 1], [1, 0], [0, 1]], bool)
    obs = Observations.register(mask, np.zeros(4, np.int64))
    obs.observe_online(np.arange(4), np.full(4, 10))
    return SelectionContext(1, np.arange(4), np.arange(4), k, obs, np.random.default_rng(0),
                            published)


def test_unknown_devices_first_then_the_instruction_of_a_weak_pick() -> None:
    sel = BMSFedSelection(BMSFedSelectionParams(tau=1.5, subsample=1.0))
    sel.bind(bmsfed_scenario(), ("a", "v"))
    ctx = _ctx({}, 2)
    ids = sel.select(ctx)
    assert len(ids) == 2 and sel.train_sensors(ids).all()   # nothing known: random, both
    g = np.array([[0.0], [1.0], [5.0], [9.0]])
    pub = {KNOWN: np.ones(4, bool), RATIO: np.array([3.0, 1.0, np.nan, np.nan]),
           DIST + "a": _dist(g), DIST + "v": _dist(g)}
    ids = sel.select(_ctx(pub, 4))
    mask = sel.train_sensors(ids)
    # b = (3 + 1)/2 = 2 > 1: visual is weak; device 0 (b_0 = 3 > τ) trains visual alone
    assert ids.tolist() == [0, 1, 2, 3]
    assert mask.tolist() == [[False, True], [True, True], [True, True], [True, True]]
    assert sel.round_stats()["bmsfed_ratio"] == 2.0


def test_the_instruction_travels_in_the_plan_and_survives_a_checkpoint() -> None:
    from raymm.protocol.messages import Broadcast, RoundPlan, plan_from_state, plan_state

    held = np.array([[True, True], [True, False]])
    plan = RoundPlan(3, np.array([2, 5]), ("sensor:a", "sensor:v", "shared"),
                     train_sensors=np.array([[False, True], [True, False]]))
    assert plan.sensors_of(2, held[0]).tolist() == [False, True]
    assert plan.training_masks(held).tolist() == [[False, True], [True, False]]
    again, _ = plan_from_state(plan_state(plan, Broadcast(3, {})))
    assert again.train_sensors is not None
    assert again.train_sensors.tolist() == plan.train_sensors.tolist()
    assert RoundPlan(3, np.array([2]), ()).sensors_of(2, held[0]).tolist() == [True, True]
