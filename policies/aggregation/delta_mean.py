"""Θ ← Θ + Σ w_i Δ_i / Σ w_i per group: FedAvg on uploaded deltas (training.exchange: delta).

FedMChain's "w/o SSCA" ablation: the chain and the sync period unchanged, plain averaging.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from policies.aggregation.fedavg import FedAvg
from raymm.protocol.registry import AGGREGATORS


@AGGREGATORS.register("delta_mean")
class DeltaMean(FedAvg):
    """FedAvg on uploaded deltas: the weighted mean change is added to the global vector."""

    takes_deltas = True

    def merge(self, current: np.ndarray, mean: np.ndarray) -> np.ndarray:
        merged: npt.NDArray[np.float32] = (current + mean).astype(np.float32)
        return merged
