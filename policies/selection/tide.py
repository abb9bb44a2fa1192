"""TIDE's score-based selection: u_i = α v_i + β η_i + γ ρ_i (+ a participation term).

Everything is computed from what the server has observed (raymm.protocol.observations): simulated
local-training times of the last 10 rounds, data sizes reported when online, and the sensor
sets given at registration. The availability clocks are never looked at.

`weights: adaptive` (beyond the paper, which fixes α, β, γ by hand): the weights, participation
term included, are chosen online from a few candidate vectors by a discounted-UCB bandit
(`policies.selection.bandit`), one vector per evaluation window, rewarded by the accuracy the
window gained per GiB or per simulated second (docs/methods/adaptive.md).
"""

from __future__ import annotations

import math
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from policies.selection.bandit import DiscountedUCB
from raymm.protocol.observations import Observations, sensor_set_sizes
from raymm.protocol.record import WEIGHT_KEYS
from raymm.protocol.registry import SELECTORS
from raymm.protocol.seams import EvalFeedback, SelectionContext, Selector
from raymm.units import GIB


class TideSelectionParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    alpha: float = Field(default=0.25, ge=0)   # speed
    beta: float = Field(default=0.35, ge=0)    # data size
    gamma: float = Field(default=0.25, ge=0)   # tier rarity
    #: weight of r_i, the share of the last 10 rounds in which i was selected (0 = TIDE)
    participation: float = Field(default=0.0, ge=0)
    #: fixed: the weights above; adaptive: a bandit picks one of `arms` per evaluation window,
    #: rewarded by the accuracy the window gained per unit of `reward` (docs/methods/adaptive.md)
    weights: Literal["fixed", "adaptive"] = "fixed"
    #: adaptive: candidate weight vectors [alpha, beta, gamma, participation]; None = the
    #: weights above, one vector stressing each of speed, data and rarity (0.55 against 0.15),
    #: and the weights above with the participation term toggled (0.15 <-> 0)
    arms: list[list[float]] | None = Field(default=None, min_length=1)
    #: adaptive: the cost a window's accuracy gain is divided by: GiB sent both ways (gib) or
    #: simulated seconds (seconds)
    reward: Literal["gib", "seconds"] = "gib"
    #: adaptive: weight of a reward one window older (1 = no forgetting)
    discount: float = Field(default=0.9, gt=0, le=1)
    #: adaptive: weight of the exploration bonus (0 = greedy after one try of every arm)
    explore: float = Field(default=0.5, ge=0)

    @field_validator("arms")
    @classmethod
    def _four_weights(cls, arms: list[list[float]] | None, info: ValidationInfo
                      ) -> list[list[float]] | None:
        if arms is not None and info.data.get("weights") == "fixed":
            raise ValueError("only used with weights: adaptive")
        for i, arm in enumerate(arms or []):
            if len(arm) != 4 or not all(math.isfinite(w) and w >= 0 for w in arm) \
                    or sum(arm) <= 0:
                raise ValueError(f"arm {i} is {arm}: each arm is [alpha, beta, gamma, "
                                 "participation], four finite numbers ≥ 0, not all zero")
        return arms

    def weight_arms(self) -> np.ndarray:
        """float [A, 4]: the candidate [alpha, beta, gamma, participation] vectors; arm 0 is
        the configured weights unless `arms` says otherwise."""
        if self.arms is not None:
            return np.array(self.arms, np.float64)
        a, b, g, p = self.alpha, self.beta, self.gamma, self.participation
        return np.array([[a, b, g, p], [0.55, 0.15, 0.15, p], [0.15, 0.55, 0.15, p],
                         [0.15, 0.15, 0.55, p], [a, b, g, 0.15 if p == 0 else 0.0]])


def tier_sizes(sensor_mask: np.ndarray) -> np.ndarray:
    """N_i: how many registered devices hold exactly device i's sensor set (what
    `Observations.set_sizes` caches)."""
    return sensor_set_sizes(sensor_mask)


def tide_scores(obs: Observations, ids: np.ndarray, alpha: float, beta: float, gamma: float,
                participation: float = 0.0) -> np.ndarray:
    """u_i for the devices `ids` (float64, same order).

    v_i = 1 / (1 + mean simulated training seconds over the last 10 rounds), 0.5 before the
    first round; η_i = |X_i| / the largest data size heard of so far; ρ_i = min_i' N_i' / N_i;
    r_i = share of the last 10 rounds selected.
    """
    tau = obs.mean_compute(ids)
    v = np.where(np.isnan(tau), 0.5, 1.0 / (1.0 + np.nan_to_num(tau)))
    # the largest size heard of (-1: never heard of) without copying the heard ones out
    top_heard = max(float(obs.num_samples.max()), 0.0) if obs.num_samples.size else 0.0
    top = top_heard if top_heard > 0 else 1.0
    eta = np.maximum(obs.num_samples[ids], 0) / top
    n_tier = obs.set_sizes
    rho = n_tier.min() / n_tier[ids]
    u = alpha * v + beta * eta + gamma * rho
    if participation:
        u = u + participation * obs.participation()[ids]
    scores: npt.NDArray[np.float64] = u.astype(np.float64)
    return scores


def top_k(ids: np.ndarray, scores: np.ndarray, k: int) -> np.ndarray:
    """The k ids with the largest score; equal scores go to the smaller id. Sorted output.

    Linear time for ascending ids (the eligible devices always are) and finite scores: every
    id scoring above the k-th largest score, then the smallest ids scoring exactly that.
    Anything else is sorted whole (the same answer, in O(n log n))."""
    n = ids.shape[0]
    if k <= 0:
        none: npt.NDArray[np.int64] = ids[:0].copy()
        return none
    if k >= n or not np.all(np.isfinite(scores)) or not np.all(ids[1:] > ids[:-1]):
        order = np.lexsort((ids, -scores))
        return np.sort(ids[order[:k]])
    kth = np.partition(scores, n - k)[n - k]   # the k-th largest score
    above = scores > kth
    ties = np.flatnonzero(scores == kth)[:k - int(above.sum())]  # ascending ids: smallest
    return np.sort(np.concatenate([ids[above], ids[ties]]))


def window_reward(before: float, after: float, cost: float) -> float:
    """A window's reward: the share of the remaining error it removed, per unit of cost,
    (after - before) / (1 - before) / cost. Gains shrink as training converges; dividing by the
    error left makes a late window's gain comparable with an early one's, so an arm is not
    favoured just for having been tried early (the discount does the rest)."""
    return (after - before) / max(1.0 - before, 1e-6) / cost


class AdaptiveWeights:
    """TIDE's score weights chosen online: one arm (weight vector) per evaluation window, a
    discounted-UCB bandit over the arms, rewarded by the window's accuracy gain (relative to the
    error left, `window_reward`) per GiB or per simulated second. The first window (no accuracy
    to gain from yet) plays arm 0 unrewarded. Deterministic: the bandit draws nothing."""

    def __init__(self, arms: np.ndarray, reward: str, discount: float, explore: float) -> None:
        self.arms, self.reward = arms, reward
        self.bandit = DiscountedUCB(arms.shape[0], discount, explore)
        self.arm = 0
        self.last = np.full(3, np.nan)  # accuracy, bytes, simulated seconds at the last eval

    def weights(self) -> np.ndarray:
        arm: npt.NDArray[np.float64] = self.arms[self.arm]
        return arm

    def observe(self, fb: EvalFeedback) -> None:
        """Reward the arm that played since the last evaluation, then pick the next arm."""
        now = np.array([fb.accuracy, fb.bytes_total, fb.sim_seconds], np.float64)
        if not np.isnan(self.last[0]):
            cost = (now[1] - self.last[1]) / GIB if self.reward == "gib" \
                else now[2] - self.last[2]
            if cost > 0:
                self.bandit.update(self.arm, window_reward(self.last[0], now[0], cost))
        self.last = now
        self.arm = self.bandit.choose()

    def state_dict(self) -> dict[str, Any]:
        return {"arm": self.arm, "last": self.last.copy(), "bandit": self.bandit.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.arm, self.last = int(state["arm"]), np.array(state["last"], np.float64)
        self.bandit.load_state_dict(state["bandit"])


@SELECTORS.register("tide")
class TideSelection(Selector):
    """Top-K eligible devices by score (all of them if fewer than K); with `weights:
    adaptive` the score's weights are chosen online (`AdaptiveWeights`)."""

    Params = TideSelectionParams

    def __init__(self, params: TideSelectionParams) -> None:
        self.p = params
        self.adaptive = AdaptiveWeights(params.weight_arms(), params.reward, params.discount,
                                        params.explore) if params.weights == "adaptive" else None
        self._used, self._arm = self._weights(), 0

    def _weights(self) -> np.ndarray:
        if self.adaptive is not None:
            return self.adaptive.weights()
        p = self.p
        return np.array([p.alpha, p.beta, p.gamma, p.participation])

    def select(self, ctx: SelectionContext) -> np.ndarray:
        ids = ctx.eligible
        self._used = self._weights()
        self._arm = self.adaptive.arm if self.adaptive is not None else 0
        if ids.shape[0] <= ctx.k:
            every: npt.NDArray[np.int64] = ids.copy()
            return every
        a, b, g, part = (float(w) for w in self._used)
        u = tide_scores(ctx.obs, ids, a, b, g, part)
        return top_k(ids, u, ctx.k)

    # --- adaptive weights (no-ops with fixed weights) ----------------------------------------
    def observe_evaluation(self, fb: EvalFeedback) -> None:
        if self.adaptive is not None:
            self.adaptive.observe(fb)

    def round_stats(self) -> dict[str, float]:
        """The weights this round's selection used (adaptive weights only)."""
        if self.adaptive is None:
            return {}
        return {"selection/arm": self._arm,
                **{f"selection/{k}": float(w) for k, w in zip(WEIGHT_KEYS, self._used)}}

    def state_dict(self) -> dict[str, Any]:
        return {} if self.adaptive is None else self.adaptive.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.adaptive is not None and state:
            self.adaptive.load_state_dict(state)


class TideParticipationParams(TideSelectionParams):
    participation: float = Field(default=0.15, ge=0)


@SELECTORS.register("tide_participation")
class TideParticipationSelection(TideSelection):
    """The score plus 0.15·r_i: the paper's variant rewarding recently selected devices (the
    paper names only the weight; r_i as the share of the last 10 rounds is our definition)."""

    Params = TideParticipationParams
