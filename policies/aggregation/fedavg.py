"""Per-group sample-weighted mean over the devices that sent the group.

With devices uploading every group this is FedAvg; with devices uploading only their sensors'
groups (upload: held) it is intra-pod merging, and a group nobody sent keeps its value.
"""

from __future__ import annotations

import numpy as np

from raymm.messages import UpdateBatch
from raymm.policy import AggregationContext, StatelessAggregator
from raymm.registry import AGGREGATORS


def weighted_mean(rows: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Σ w_i x_i / Σ w_i, accumulated in float64 row by row (deterministic: no BLAS threads)."""
    w = np.asarray(weights, dtype=np.float64)
    acc = (rows.astype(np.float64) * (w / w.sum())[:, None]).sum(axis=0)
    return acc.astype(np.float32)


@AGGREGATORS.register("fedavg")
class FedAvg(StatelessAggregator):
    """Sample-weighted mean of each group over the devices that sent it (FedAvg; intra-pod
    merging when devices upload only their sensors' groups)."""

    def __init__(self, params: object) -> None:
        self.params = params

    def aggregate(self, params: dict[str, np.ndarray], batch: UpdateBatch,
                  ctx: AggregationContext) -> dict[str, np.ndarray]:
        out = dict(params)
        for g, rows in batch.updates.items():
            weights = batch.group_weights(g)
            if weights.sum() > 0:
                out[g] = weighted_mean(rows, weights)
        return out
