"""A selection rule and an aggregator, registered by name as raymm's own policies are."""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from raymm.protocol.messages import UpdateBatch
from raymm.protocol.registry import AGGREGATORS, SELECTORS
from raymm.protocol.seams import (
    AggregationContext,
    Aggregator,
    NoParams,
    SelectionContext,
    Selector,
)


class MostDataParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    #: share of the K places given to devices drawn uniformly at random instead
    explore: float = Field(default=0.2, ge=0, le=1)


@SELECTORS.register("mylab_most_data")
class MostData(Selector):
    """The eligible devices holding the most training samples, plus a share drawn at random
    so that small devices train now and then."""

    Params = MostDataParams

    def __init__(self, params: MostDataParams) -> None:
        self.explore = params.explore

    def select(self, ctx: SelectionContext) -> np.ndarray:
        ids = ctx.eligible
        if ids.shape[0] <= ctx.k:
            return ids.copy()
        n_random = int(round(self.explore * ctx.k))
        tie = ctx.rng.random(ids.shape[0])  # equal sizes: a random order, not the lowest ids
        order = np.lexsort((tie, -ctx.obs.num_samples[ids]))  # last key first: most samples
        largest = ids[order[: ctx.k - n_random]]
        others = np.setdiff1d(ids, largest)
        drawn = ctx.rng.choice(others, size=n_random, replace=False)
        return np.sort(np.concatenate([largest, drawn]))


@AGGREGATORS.register("mylab_median")
class CoordinateMedian(Aggregator):
    """Per group, the coordinate-wise median over the devices that sent it: a few wild updates
    cannot drag the model far."""

    def __init__(self, params: NoParams) -> None:
        pass

    def aggregate(self, params: dict[str, np.ndarray], batch: UpdateBatch,
                  ctx: AggregationContext) -> dict[str, np.ndarray]:
        out = dict(params)  # a group nobody sent keeps its value
        for group, rows in batch.updates.items():
            out[group] = np.median(rows, axis=0).astype(np.float32)
        return out
