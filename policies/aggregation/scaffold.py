"""SCAFFOLD's server side: FedAvg of the trained vectors plus the server control variate.

c ← c + (1/N)·Σ_{i∈S} Δc_i per group (N = all devices), broadcast as the extra
`scaffold_c/<g>` (so it is counted in the downlink, as SCAFFOLD doubles the traffic). The model
update is the sample-weighted mean of the trained vectors (global step size 1).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from policies.aggregation.fedavg import FedAvg
from policies.objective.scaffold import DC, C
from raymm.protocol.messages import UpdateBatch
from raymm.protocol.registry import AGGREGATORS
from raymm.protocol.seams import AggregationContext


@AGGREGATORS.register("scaffold")
class Scaffold(FedAvg):
    combinable = True  # the model step is FedAvg's; control variates travel as extras

    def __init__(self, params: object) -> None:
        super().__init__(params)
        self.c: dict[str, np.ndarray] = {}

    def aggregate(self, params: dict[str, np.ndarray], batch: UpdateBatch,
                  ctx: AggregationContext) -> dict[str, np.ndarray]:
        c = dict(self.c)
        for key, dc in batch.extras.items():
            if key.startswith(DC):
                g = key[len(DC):]
                total = dc.astype(np.float64).sum(axis=0) / ctx.obs.n
                c[g] = (c.get(g, np.zeros(dc.shape[1], np.float32)) + total).astype(np.float32)
        self.c = c
        return super().aggregate(params, batch, ctx)

    def extras(self, round: int) -> dict[str, np.ndarray]:
        return {C + g: v for g, v in self.c.items()}

    def state_dict(self) -> dict[str, Any]:
        return {"c": dict(self.c)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.c = {g: np.asarray(v, np.float32) for g, v in state["c"].items()}


@AGGREGATORS.register("scaffold_delta")
class ScaffoldDelta(Scaffold):
    """SCAFFOLD with periodic sync (training.exchange: delta): the same control variates, the
    model moved by the weighted mean uploaded delta."""

    takes_deltas = True

    def merge(self, current: np.ndarray, mean: np.ndarray) -> np.ndarray:
        merged: npt.NDArray[np.float32] = (current + mean).astype(np.float32)
        return merged
