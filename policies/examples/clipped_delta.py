"""Worked example (docs/adding-a-policy.md): an aggregator of deltas.

Devices upload the change of each trained group since they downloaded it
(`training.exchange: delta`). Each device's change of a group is scaled down to an L2 norm of
at most `max_norm` before the sample-weighted mean change is added to the global vector, so no
single device (a buggy or hostile one, or one with far more local steps) can pull the model
further than `max_norm`.
"""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from raymm.protocol.messages import UpdateBatch
from raymm.protocol.registry import AGGREGATORS
from raymm.protocol.seams import AggregationContext, Aggregator


class ClippedDeltaParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    #: largest L2 norm of one device's change of one group; longer changes are scaled down
    max_norm: float = Field(default=1.0, gt=0)


def clip_rows(rows: np.ndarray, max_norm: float) -> tuple[np.ndarray, np.ndarray]:
    """(rows scaled to a norm of at most `max_norm`, whether each row was scaled), float64."""
    rows = rows.astype(np.float64)
    norms = np.linalg.norm(rows, axis=1)
    scale = np.minimum(1.0, max_norm / np.maximum(norms, 1e-12))
    return rows * scale[:, None], norms > max_norm


@AGGREGATORS.register("clipped_delta_mean")
class ClippedDeltaMean(Aggregator):
    """Θ_g ← Θ_g + Σ w_i clip(Δ_i) / Σ w_i over the devices that sent group g."""

    Params = ClippedDeltaParams
    #: uploads are changes, not parameters: `raymm validate` asks for training.exchange: delta
    takes_deltas = True
    # not `combinable`: clipping reads every device's own row, so hosts must not pre-sum them

    def __init__(self, params: ClippedDeltaParams) -> None:
        self.max_norm = params.max_norm
        self.clipped = 0.0

    def aggregate(self, params: dict[str, np.ndarray], batch: UpdateBatch,
                  ctx: AggregationContext) -> dict[str, np.ndarray]:
        out = dict(params)  # a group nobody sent keeps its vector
        n_rows = n_clipped = 0
        for g, rows in batch.updates.items():
            clipped, was = clip_rows(rows, self.max_norm)
            w = batch.group_weights(g)  # sample counts, in row order
            # a sum over rows in device-id order (not a BLAS product, whose order may depend
            # on threads): the same numbers in the driver and in a Ray actor
            mean = (clipped * w[:, None]).sum(axis=0) / w.sum()
            out[g] = (params[g] + mean).astype(np.float32)
            n_rows, n_clipped = n_rows + len(was), n_clipped + int(was.sum())
        self.clipped = n_clipped / max(n_rows, 1)
        return out

    def round_stats(self) -> dict[str, float]:
        """The share of the round's (device, group) changes that were clipped: a column of
        rounds.parquet, to tune `max_norm` by."""
        return {"clipped_share": self.clipped}
