"""Coordinate-wise trimmed mean: a robust aggregation (and the worked example in
docs/adding-a-policy.md)."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field

from raymm.protocol.messages import UpdateBatch
from raymm.protocol.registry import AGGREGATORS
from raymm.protocol.seams import AggregationContext, Aggregator


class TrimmedMeanParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    #: share of the senders dropped at each end of every coordinate, in [0, 0.5)
    trim: float = Field(default=0.1, ge=0, lt=0.5)


def trimmed_mean(rows: np.ndarray, trim: float) -> np.ndarray:
    """Mean of each column after dropping the `floor(trim·n)` smallest and largest values."""
    n = rows.shape[0]
    cut = int(np.floor(trim * n))
    kept = np.sort(rows.astype(np.float64), axis=0)[cut:n - cut]
    mean: npt.NDArray[np.float32] = kept.mean(axis=0).astype(np.float32)
    return mean


@AGGREGATORS.register("trimmed_mean")
class TrimmedMean(Aggregator):
    """Per group, the coordinate-wise trimmed mean over the devices that sent it (unweighted:
    a device's sample count is exactly what a misbehaving device could lie about)."""

    Params = TrimmedMeanParams

    def __init__(self, params: TrimmedMeanParams) -> None:
        self.trim = params.trim

    def aggregate(self, params: dict[str, np.ndarray], batch: UpdateBatch,
                  ctx: AggregationContext) -> dict[str, np.ndarray]:
        out = dict(params)
        for g, rows in batch.updates.items():
            out[g] = trimmed_mean(rows, self.trim)
        return out
