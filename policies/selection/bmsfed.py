"""BMSFed's balanced modality selection (Fan et al., ECCV 2024, arXiv 2401.00403).

Stochastic greedy facility location over the devices' last updates (the distances that
aggregation `bmsfed` publishes, `SelectionContext.published`): K picks, each from a random
candidate subset R of the devices not picked yet, |R| = max(K', ⌊subsample·|V|⌋). Two
running minima over the known devices j are kept, d for whole-model updates and d^w for the
weak modality's updates, both +∞ at first; the candidate r minimising Σ_j min(d_j, D_{j,r})
is the multimodal pick, the one minimising Σ_j min(d^w_j, D^w_{j,r}) the weak-modality pick.
The weak modality is b's second sensor when the sample-weighted mean imbalance ratio b of the
multimodal devices is > 1 (the first dominates), else the first; the weak-modality pick is
taken, and told to train with that sensor only (`train_sensors`), when its own ratio is
beyond τ (b_r > τ, or b_r < 1/τ), else the multimodal pick; the chosen one's running minimum
absorbs the pick's column. D is the whole-model distance, √(D^a² + D^b²).

A device the aggregator knows nothing of yet (it never sent an update) cannot be placed:
such eligible devices are picked first, at random (the authors instead train every client
once before the first round).
"""

from __future__ import annotations

import math

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from policies.aggregation.bmsfed import DIST, KNOWN, RATIO
from raymm.config.schema import Scenario
from raymm.errors import refuse
from raymm.protocol.registry import SELECTORS
from raymm.protocol.seams import SelectionContext, Selector


class BMSFedSelectionParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    #: τ, how far a device's imbalance ratio must lie beyond 1 for it to train the weak
    #: modality alone (the authors' `balansubmod_thresh`: 1.5 or 2.0 in their scripts)
    tau: float = Field(default=1.5, ge=1.0)
    #: share of the remaining devices drawn as candidates at each greedy step (at least K)
    subsample: float = Field(default=0.1, gt=0, le=1)
    #: K as a share of the eligible devices (⌊fraction·|eligible| + ½⌋, at most selection.k);
    #: None: K = selection.k
    fraction: float | None = Field(default=None, gt=0, le=1)


def balanced_greedy(dist: np.ndarray, weak_dist: np.ndarray, weak_wins: np.ndarray, k: int,
                    subsample: float, rng: np.random.Generator
                    ) -> tuple[np.ndarray, np.ndarray]:
    """(picked candidates in pick order, whether each trains the weak modality only).

    `dist`, `weak_dist`: [targets, candidates] distances between updates (whole model, weak
    modality); `weak_wins` [candidates] bool: a weak-modality pick of that candidate is taken
    (its ratio lies beyond τ). Each step draws max(k, ⌊subsample·candidates⌋) of the candidates
    not picked yet from `rng` (all of them when that is not fewer)."""
    n_targets, n_cand = dist.shape
    left = np.arange(n_cand)
    d = np.full(n_targets, np.inf)     # running minimum of the multimodal picks
    d_w = np.full(n_targets, np.inf)   # of the weak-modality picks
    size = max(k, int(subsample * n_cand))
    picked, weak = [], []
    for _ in range(min(k, n_cand)):
        cand = rng.choice(left, size, replace=False) if size < left.shape[0] else left
        multi = np.minimum(d[:, None], dist[:, cand])
        uni = np.minimum(d_w[:, None], weak_dist[:, cand])
        i, i_w = int(multi.sum(axis=0).argmin()), int(uni.sum(axis=0).argmin())
        alone = bool(weak_wins[cand[i_w]])
        if alone:
            r, d_w = int(cand[i_w]), uni[:, i_w]
        else:
            r, d = int(cand[i]), multi[:, i]
        picked.append(r)
        weak.append(alone)
        left = left[left != r]
    return np.asarray(picked, np.int64), np.asarray(weak, bool)


def published(ctx: SelectionContext, name: str, default: np.ndarray) -> np.ndarray:
    """The aggregator's published array `name`, or `default` while it has none of that shape
    (before its first aggregation)."""
    value = np.asarray(ctx.published.get(name, default))
    return value if value.shape == default.shape else default


@SELECTORS.register("bmsfed")
class BMSFedSelection(Selector):
    """K devices by balanced stochastic greedy facility location; weak-modality picks train
    that modality only."""

    Params = BMSFedSelectionParams

    def __init__(self, params: BMSFedSelectionParams) -> None:
        self.p = params
        self.sensors: tuple[str, ...] = ()
        self._last: tuple[np.ndarray, np.ndarray] | None = None   # (ids, sensor mask)
        self._stats: dict[str, float] = {}

    @staticmethod
    def check_scenario(params: BMSFedSelectionParams, scenario: Scenario,
                       sensors: tuple[str, ...] | None) -> list[str]:
        if scenario.aggregation.name not in ("bmsfed", "bmsfed_delta"):
            return ["selection.name: bmsfed reads the update distances that aggregation "
                    f"bmsfed publishes (got aggregation {scenario.aggregation.name!r})"]
        return []

    def bind(self, scenario: Scenario, sensors: tuple[str, ...]) -> None:
        refuse(self.check_scenario(self.p, scenario, sensors))
        self.sensors = tuple(sensors)

    def _k(self, ctx: SelectionContext) -> int:
        n = int(ctx.eligible.shape[0])
        if self.p.fraction is None:
            return min(ctx.k, n)
        return min(ctx.k, max(1, math.floor(self.p.fraction * n + 0.5))) if n else 0

    def select(self, ctx: SelectionContext) -> np.ndarray:
        k = self._k(ctx)
        elig = ctx.eligible
        known = published(ctx, KNOWN, np.zeros(ctx.obs.n, bool))
        fresh = elig[~known[elig]]
        both: np.ndarray = np.asarray(ctx.obs.sensor_mask.all(axis=1), bool)
        weak_only = np.zeros(0, np.int64)
        if fresh.shape[0] >= k:  # nothing to place yet: a random draw of the unknown ones
            chosen = ctx.rng.choice(fresh, k, replace=False) if k else fresh[:0]
        else:
            cand = elig[known[elig]]
            picked, weak = self._greedy(ctx, cand, k - fresh.shape[0], known, both)
            chosen = np.concatenate([fresh, cand[picked]])
            weak_only = cand[picked[weak]]
        ids = np.sort(np.asarray(chosen, np.int64))
        mask = np.ones((ids.shape[0], len(self.sensors)), bool)
        if weak_only.shape[0]:
            mask[np.isin(ids, weak_only)] = self._weak_row(ctx, known, both)
        self._last = (ids, mask)
        self._stats = {"bmsfed_ratio": self._global_ratio(ctx, known, both),
                       "bmsfed_weak_only": float(weak_only.shape[0])}
        return ids

    def _global_ratio(self, ctx: SelectionContext, known: np.ndarray, both: np.ndarray
                      ) -> float:
        """b: the sample-weighted mean ratio of the multimodal devices that reported one."""
        ratio = published(ctx, RATIO, np.full(ctx.obs.n, np.nan))
        use = both & known & np.isfinite(ratio)
        if not use.any():
            return 1.0
        w = np.maximum(ctx.obs.num_samples[use].astype(np.float64), 1.0)
        return float((ratio[use] * w).sum() / w.sum())

    def _weak_row(self, ctx: SelectionContext, known: np.ndarray, both: np.ndarray
                  ) -> np.ndarray:
        """The sensor mask of a weak-modality pick: the second sensor when b > 1, else the
        first."""
        row = np.zeros(len(self.sensors), bool)
        row[1 if self._global_ratio(ctx, known, both) > 1 else 0] = True
        return row

    def _greedy(self, ctx: SelectionContext, cand: np.ndarray, k: int, known: np.ndarray,
                both: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Positions in `cand` picked by `balanced_greedy`, and which train the weak modality
        only; targets are every known device."""
        if k <= 0 or cand.shape[0] == 0:
            return np.zeros(0, np.int64), np.zeros(0, bool)
        targets = np.flatnonzero(known)
        n = ctx.obs.n
        per = [published(ctx, DIST + m, np.zeros((n, n))) for m in self.sensors]
        full = np.sqrt(sum(d ** 2 for d in per))
        b = self._global_ratio(ctx, known, both)
        weak = 1 if b > 1 else 0
        ratio = published(ctx, RATIO, np.full(n, np.nan))[cand]
        with np.errstate(invalid="ignore"):
            wins = both[cand] & ((ratio > self.p.tau) if weak == 1 else
                                 (ratio < 1.0 / self.p.tau))
        return balanced_greedy(full[np.ix_(targets, cand)], per[weak][np.ix_(targets, cand)],
                               wins, k, self.p.subsample, ctx.rng)

    def round_stats(self) -> dict[str, float]:
        """The global imbalance ratio b the round's selection used, and how many devices it
        told to train the weak modality alone."""
        return dict(self._stats)

    def train_sensors(self, selected: np.ndarray) -> np.ndarray | None:
        if self._last is None or not np.array_equal(self._last[0], selected):
            return None
        return self._last[1]
