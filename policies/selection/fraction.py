"""A fixed fraction of the eligible devices each round (FedMChain samples clients at 0.7)."""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field

from raymm.protocol.registry import SELECTORS
from raymm.protocol.seams import SelectionContext, Selector


class FractionParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    fraction: float = Field(default=0.7, gt=0, le=1)


@SELECTORS.register("fraction")
class FractionSelection(Selector):
    """floor(fraction·|eligible| + 1/2) eligible devices uniformly at random: at least one when
    any is eligible, at most `k`."""

    Params = FractionParams

    def __init__(self, params: FractionParams) -> None:
        self.fraction = params.fraction

    def select(self, ctx: SelectionContext) -> np.ndarray:
        n = int(ctx.eligible.shape[0])
        take = min(ctx.k, max(1, math.floor(self.fraction * n + 0.5))) if n else 0
        if take >= n:
            every: npt.NDArray[np.int64] = ctx.eligible.copy()
            return every
        return np.sort(ctx.rng.choice(ctx.eligible, size=take, replace=False))
