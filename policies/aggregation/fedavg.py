"""Per-group sample-weighted mean over the devices that sent the group.

With devices uploading every group this is FedAvg; with devices uploading only their sensors'
groups (upload: held) it is intra-pod merging, and a group nobody sent keeps its value.
"""

from __future__ import annotations

import numpy as np

from raymm.protocol.messages import UpdateBatch
from raymm.protocol.registry import AGGREGATORS
from raymm.protocol.seams import AggregationContext, Aggregator


@AGGREGATORS.register("fedavg")
class FedAvg(Aggregator):
    """Sample-weighted mean of each group over the devices that sent it (FedAvg; intra-pod
    merging when devices upload only their sensors' groups)."""

    #: needs only per-group weighted sums: hosts may send them pre-summed (raymm.protocol.combine)
    combinable = True

    def __init__(self, params: object) -> None:
        self.params = params

    def aggregate(self, params: dict[str, np.ndarray], batch: UpdateBatch,
                  ctx: AggregationContext) -> dict[str, np.ndarray]:
        out = dict(params)
        for g in batch.groups():
            mean = batch.weighted_mean(g, self.weights(g, batch, ctx))
            if mean is not None:
                out[g] = self.merge(params[g], mean)
        return out

    def weights(self, group: str, batch: UpdateBatch, ctx: AggregationContext
                ) -> np.ndarray | None:
        """Per-row weights of `group`'s senders, or None for their sample counts (the default
        of `UpdateBatch.weighted_mean`). Custom weights need every sender's row: a subclass that
        returns any must not declare itself `combinable` when it does."""
        return None

    def merge(self, current: np.ndarray, mean: np.ndarray) -> np.ndarray:
        """The new global vector from the mean of the uploads (they are parameters here)."""
        return mean
