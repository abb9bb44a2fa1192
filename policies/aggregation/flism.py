"""FLISM's server (Orzikulova et al., arXiv 2405.11828; docs/methods/flism.md): the main model
is the mean of the uploads weighted by the reciprocal of each device's mean predictive entropy
(modality quality-aware aggregation), and the teacher of the next round's distillation is
their unweighted mean, broadcast as an extra (`flism_teacher/<group>`, counted as downlink).

`flism_delta` is the same rule on the deltas of a periodic exchange (`training.exchange:
delta`, `raymm.app.variants.PERIODIC_TWIN`): every delta of a sync was taken against the
vector the server holds, so the weighted mean of the deltas added to it is the weighted mean
of the devices' vectors.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel

from policies.aggregation.fedavg import FedAvg
from policies.objective.flism import ENTROPY, TEACHER
from raymm.config.schema import Scenario
from raymm.protocol.messages import UpdateBatch
from raymm.protocol.registry import AGGREGATORS
from raymm.protocol.seams import AggregationContext

#: a floor under the reported entropies, so a device certain of every sample (H = 0) gets a
#: large but finite weight
MIN_ENTROPY = 1e-6


def entropy_weights(entropies: np.ndarray) -> np.ndarray:
    """1/H_i per device (float64), H floored at `MIN_ENTROPY`."""
    h = np.asarray(entropies, np.float64).reshape(-1)
    return 1.0 / np.maximum(h, MIN_ENTROPY)


@AGGREGATORS.register("flism")
class FlismAggregator(FedAvg):
    """θ ← Σ_i (1/H_i) θ_i / Σ_i (1/H_i) over the devices that sent each group; the teacher
    θ_T ← the plain mean of the same uploads, sent with the next round."""

    # custom per-row weights (entropies) need every sender's row
    combinable = False

    def __init__(self, params: object) -> None:
        super().__init__(params)
        #: group -> the teacher's vector (empty before the first aggregation)
        self.teacher: dict[str, np.ndarray] = {}

    @staticmethod
    def check_scenario(params: BaseModel, scenario: Scenario, sensors: tuple[str, ...] | None
                       ) -> list[str]:
        if scenario.objective.name != "flism":
            return [f"aggregation.name: {scenario.aggregation.name} weights the uploads by the "
                    "entropy that objective flism reports (got objective "
                    f"{scenario.objective.name!r})"]
        return []

    def weights(self, group: str, batch: UpdateBatch, ctx: AggregationContext
                ) -> np.ndarray | None:
        """1/H of each sender of `group`, in row order."""
        w: np.ndarray = entropy_weights(batch.extras[ENTROPY])[batch.senders[group]]
        return w

    def aggregate(self, params: dict[str, np.ndarray], batch: UpdateBatch,
                  ctx: AggregationContext) -> dict[str, np.ndarray]:
        out = super().aggregate(params, batch, ctx)
        # between the syncs of a periodic exchange nothing arrives: the teacher stays
        teacher = {g: self.teacher.get(g, out[g]) for g in out}
        for g in batch.groups():
            plain = batch.weighted_mean(g, np.ones(len(batch.senders[g])))
            if plain is not None:
                teacher[g] = self.merge(params[g], plain)
        self.teacher = {g: np.asarray(v, np.float32) for g, v in teacher.items()}
        return out

    def extras(self, round: int) -> dict[str, np.ndarray]:
        return {TEACHER + g: v for g, v in self.teacher.items()}

    def state_dict(self) -> dict[str, Any]:
        return {"teacher": {g: v.copy() for g, v in self.teacher.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.teacher = {g: np.asarray(v, np.float32).copy()
                        for g, v in state["teacher"].items()}


@AGGREGATORS.register("flism_delta")
class FlismDelta(FlismAggregator):
    """`flism` on uploaded deltas: the weighted (and, for the teacher, plain) mean change is
    added to the server's vector."""

    takes_deltas = True

    def merge(self, current: np.ndarray, mean: np.ndarray) -> np.ndarray:
        merged: npt.NDArray[np.float32] = (current + mean).astype(np.float32)
        return merged
