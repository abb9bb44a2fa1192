"""Θ ← Θ + Σ w_i Δ_i / Σ w_i per group: FedAvg on uploaded deltas (training.exchange: delta).

FedMChain's "w/o SSCA" ablation: the chain and the sync period unchanged, plain averaging.
"""

from __future__ import annotations

import numpy as np

from policies.aggregation.fedavg import weighted_mean
from raymm.messages import UpdateBatch
from raymm.policy import AggregationContext, StatelessAggregator
from raymm.registry import AGGREGATORS


@AGGREGATORS.register("delta_mean")
class DeltaMean(StatelessAggregator):
    takes_deltas = True

    def __init__(self, params: object) -> None:
        self.params = params

    def aggregate(self, params: dict[str, np.ndarray], batch: UpdateBatch,
                  ctx: AggregationContext) -> dict[str, np.ndarray]:
        out = dict(params)
        for g, rows in batch.updates.items():
            weights = batch.group_weights(g)
            if weights.sum() > 0:
                out[g] = (params[g] + weighted_mean(rows, weights)).astype(np.float32)
        return out
