"""Uniform random selection and all-online selection."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from raymm.protocol.registry import SELECTORS
from raymm.protocol.seams import SelectionContext, Selector


@SELECTORS.register("random")
class RandomSelection(Selector):
    """K eligible devices uniformly at random (all of them if fewer than K)."""

    def __init__(self, params: object) -> None:
        self.params = params

    def select(self, ctx: SelectionContext) -> np.ndarray:
        if ctx.eligible.shape[0] <= ctx.k:
            every: npt.NDArray[np.int64] = ctx.eligible.copy()
            return every
        return np.sort(ctx.rng.choice(ctx.eligible, size=ctx.k, replace=False))


@SELECTORS.register("all_online")
class AllOnline(Selector):
    """Every eligible online device trains (k is ignored)."""

    every_eligible = True

    def __init__(self, params: object) -> None:
        self.params = params

    def select(self, ctx: SelectionContext) -> np.ndarray:
        every: npt.NDArray[np.int64] = ctx.eligible.copy()
        return every
