"""Least-selected-first selection: a fairness baseline (and the worked example in
docs/adding-a-policy.md)."""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel, ConfigDict

from raymm.protocol.registry import SELECTORS
from raymm.protocol.seams import SelectionContext, Selector


class LeastSelectedParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    #: break ties between equally often selected devices at random (else by device id)
    random_ties: bool = False


@SELECTORS.register("least_selected")
class LeastSelected(Selector):
    """The K eligible devices selected least often so far; ties by device id (or at random)."""

    Params = LeastSelectedParams

    def __init__(self, params: LeastSelectedParams) -> None:
        self.random_ties = params.random_ties

    def select(self, ctx: SelectionContext) -> np.ndarray:
        ids = ctx.eligible
        times = ctx.obs.times_selected[ids]
        tie = ctx.rng.random(len(ids)) if self.random_ties else ids
        order = np.lexsort((tie, times))  # last key is primary: fewest selections first
        return np.sort(ids[order[: ctx.k]])
