"""Discounted UCB (Garivier & Moulines, ALT 2011): a bandit for rewards that drift.

TIDE's adaptive weights (`selection: {name: tide, weights: adaptive}`) play one arm — one
weight vector — per evaluation window and are rewarded by the accuracy that window gained per
unit of cost. Accuracy gains shrink as training converges, so old rewards are discounted by
`discount` per window: an arm's estimate follows its recent windows, and an arm not played for
a while regains an exploration bonus. No randomness: ties go to the lower arm index, so a run
is deterministic for its seed. Rewards are compared in units of the largest |reward| seen, so
the exploration weight does not depend on whether costs are counted in GiB or in seconds.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np


class DiscountedUCB:
    """Arms 0..A-1. `choose()` the next arm, `update(arm, reward)` after its window.

    value_a = mean_a / scale + explore·sqrt(log n / N_a), with N_a = Σ_s discount^(t-s)·1[a_s =
    a] the discounted plays, mean_a the discounted mean reward, n = Σ_a N_a and scale the
    largest |reward| so far. Unplayed arms come first, in index order.
    """

    def __init__(self, arms: int, discount: float = 0.9, explore: float = 0.5) -> None:
        self.discount, self.explore = discount, explore
        self.counts = np.zeros(arms)   # discounted plays N_a
        self.sums = np.zeros(arms)     # discounted reward sums
        self.played = np.zeros(arms, bool)
        self.scale = 0.0

    def __setstate__(self, state: dict[str, object]) -> None:
        # a Ray actor unpickles numpy arrays as read-only views of the object store; this
        # state is updated in place
        self.__dict__.update({k: v.copy() if isinstance(v, np.ndarray) else v
                              for k, v in state.items()})

    def values(self) -> np.ndarray:
        """The index each arm is chosen by (+inf for an unplayed arm)."""
        n = max(float(self.counts.sum()), 1.0)
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = self.sums / self.counts / (self.scale if self.scale > 0 else 1.0)
            bonus = self.explore * np.sqrt(math.log(n) / self.counts)
        return np.where(self.played, mean + bonus, np.inf)

    def choose(self) -> int:
        return int(np.argmax(self.values()))  # first maximum: ties to the lower index

    def update(self, arm: int, reward: float) -> None:
        self.counts *= self.discount
        self.sums *= self.discount
        self.counts[arm] += 1.0
        self.sums[arm] += reward
        self.played[arm] = True
        self.scale = max(self.scale, abs(reward))

    def state_dict(self) -> dict[str, Any]:
        return {"counts": self.counts.copy(), "sums": self.sums.copy(),
                "played": self.played.copy(), "scale": self.scale}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.counts, self.sums = np.array(state["counts"]), np.array(state["sums"])
        self.played, self.scale = np.array(state["played"]), float(state["scale"])
