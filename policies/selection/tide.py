"""TIDE's score-based selection: u_i = α v_i + β η_i + γ ρ_i (+ a participation term).

Everything is computed from what the server has observed (raymm.observations): simulated
local-training times of the last 10 rounds, data sizes reported when online, and the sensor
sets given at registration. The availability clocks are never looked at.
"""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from raymm.observations import Observations, sensor_set_sizes
from raymm.policy import SelectionContext
from raymm.registry import SELECTORS


class TideSelectionParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    alpha: float = Field(default=0.25, ge=0)   # speed
    beta: float = Field(default=0.35, ge=0)    # data size
    gamma: float = Field(default=0.25, ge=0)   # tier rarity
    #: weight of r_i, the share of the last 10 rounds in which i was selected (0 = TIDE)
    participation: float = Field(default=0.0, ge=0)


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
    tau = obs.mean_compute()[ids]
    v = np.where(np.isnan(tau), 0.5, 1.0 / (1.0 + np.nan_to_num(tau)))
    heard = obs.num_samples[obs.num_samples >= 0]
    top_heard = float(heard.max()) if heard.size else 0.0
    top = top_heard if top_heard > 0 else 1.0
    eta = np.maximum(obs.num_samples[ids], 0) / top
    n_tier = obs.set_sizes
    rho = n_tier.min() / n_tier[ids]
    u = alpha * v + beta * eta + gamma * rho
    if participation:
        u = u + participation * obs.participation()[ids]
    return u.astype(np.float64)


def top_k(ids: np.ndarray, scores: np.ndarray, k: int) -> np.ndarray:
    """The k ids with the largest score; equal scores go to the smaller id. Sorted output."""
    order = np.lexsort((ids, -scores))
    return np.sort(ids[order[:k]])


@SELECTORS.register("tide")
class TideSelection:
    """Top-K eligible devices by score (all of them if fewer than K)."""

    Params = TideSelectionParams

    def __init__(self, params: TideSelectionParams) -> None:
        self.p = params

    def select(self, ctx: SelectionContext) -> np.ndarray:
        ids = ctx.eligible
        if ids.shape[0] <= ctx.k:
            return ids.copy()
        p = self.p
        u = tide_scores(ctx.obs, ids, p.alpha, p.beta, p.gamma, p.participation)
        return top_k(ids, u, ctx.k)


class TideParticipationParams(TideSelectionParams):
    participation: float = Field(default=0.15, ge=0)


@SELECTORS.register("tide_participation")
class TideParticipationSelection(TideSelection):
    """The score plus 0.15·r_i: the paper's variant rewarding recently selected devices (the
    paper names only the weight; r_i as the share of the last 10 rounds is our definition)."""

    Params = TideParticipationParams
