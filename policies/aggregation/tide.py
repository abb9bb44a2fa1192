"""TIDE's aggregation: per-group merging over the senders, plus server class prototypes.

What each device sends is fixed by `training.upload`: with `held` a device returns only its
sensors' groups and `shared`, so the per-group mean over senders is decoupled intra-pod merging
(θ_m over S[t] ∩ C_m, kept when no pod member was selected; θ_sh over all of S[t]); with `all`
it is plain averaging (the paper's Eq. 2, the ablation's "core").

Prototypes: devices report per-class means of z and class counts (`class_means`,
`class_counts`, see policies.objective.tide). The server pools them into z̄_y[t] (weighted by
class counts, i.e. the mean of z over every selected sample of class y; the paper only says
"averages") and sets p_y ← 0.5 p_y + 0.5 z̄_y (p_y = z̄_y the first time). Classes nobody
reported keep their prototype. Prototypes accumulate from round 1 and are broadcast only from
round t_w + 1 on.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from policies.aggregation.fedavg import FedAvg
from raymm.config.schema import Scenario
from raymm.protocol.messages import UpdateBatch
from raymm.protocol.registry import AGGREGATORS
from raymm.protocol.seams import AggregationContext

SENSOR_PREFIX = "sensor:"


class TideAggregationParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    #: t_w: prototypes are sent from round warmup + 1 on
    warmup: int = Field(default=10, ge=0)
    #: p ← momentum·p + (1 - momentum)·z̄
    momentum: float = Field(default=0.5, ge=0, le=1)
    #: "evidence": a pod member's weight for θ_m is |X_i|·exp(-ℓ_i,m / temperature), ℓ_i,m its
    #: aux-head loss (the paper: "lower loss, larger weight"; the form is our choice)
    weighting: Literal["data", "evidence"] = "data"
    temperature: float = Field(default=1.0, gt=0)


def evidence_weights(num_samples: np.ndarray, losses: np.ndarray, temperature: float
                     ) -> np.ndarray:
    """|X_i|·exp(-(ℓ_i - min ℓ)/T): shifting by the minimum changes nothing after normalising
    but keeps exp() from underflowing when every loss is large. A sender without a loss (NaN:
    it does not hold the sensor, possible only with upload: all) has no evidence: weight 0."""
    known = ~np.isnan(losses)
    if not known.any():
        return np.zeros(losses.shape[0])
    shifted = (np.where(known, losses, 0.0) - losses[known].min()) / temperature
    return np.where(known, num_samples.astype(np.float64) * np.exp(-shifted), 0.0)


def update_prototypes(protos: np.ndarray | None, has: np.ndarray | None, means: np.ndarray,
                      counts: np.ndarray, momentum: float) -> tuple[np.ndarray, np.ndarray]:
    """One server prototype step. `means` [n, C, F], `counts` [n, C] from n devices.

    Returns (prototypes float32 [C, F], has-prototype bool [C]); inputs are not mutated.
    """
    c = counts.astype(np.float64)
    total = c.sum(axis=0)                                                  # [C]
    pooled = (means.astype(np.float64) * c[:, :, None]).sum(axis=0)       # [C, F]
    seen = total > 0
    zbar = pooled / np.maximum(total, 1.0)[:, None]
    if protos is None or has is None:
        protos, has = np.zeros_like(zbar), np.zeros(zbar.shape[0], dtype=bool)
    old = protos.astype(np.float64)
    mixed = np.where(has[:, None], momentum * old + (1.0 - momentum) * zbar, zbar)
    new = np.where(seen[:, None], mixed, old)
    return new.astype(np.float32), has | seen


@AGGREGATORS.register("tide")
class TideAggregation(FedAvg):
    Params = TideAggregationParams

    def __init__(self, params: TideAggregationParams) -> None:
        super().__init__(params)
        self.p = params
        self.prototypes: np.ndarray | None = None
        self.has_prototype: np.ndarray | None = None
        self._payload: tuple[int, dict[str, np.ndarray]] | None = None
        # data weighting needs only weighted sums (hosts may pre-sum); evidence weighting
        # compares every sender's aux loss, so it needs their rows
        self.combinable = params.weighting == "data"

    def aggregate(self, params: dict[str, np.ndarray], batch: UpdateBatch,
                  ctx: AggregationContext) -> dict[str, np.ndarray]:
        out = super().aggregate(params, batch, ctx)
        if "class_means" in batch.extras and batch.n:
            self.prototypes, self.has_prototype = update_prototypes(
                self.prototypes, self.has_prototype, batch.extras["class_means"],
                batch.extras["class_counts"], self.p.momentum)
        return out

    def weights(self, group: str, batch: UpdateBatch, ctx: AggregationContext
                ) -> np.ndarray | None:
        """Per-row weights, or None for the sample counts (the default of `weighted_mean`)."""
        if self.p.weighting == "data" or not group.startswith(SENSOR_PREFIX):
            return None
        w = batch.group_weights(group)
        if "aux_loss" not in batch.extras:
            raise RuntimeError("evidence-weighted merging needs the devices' aux-head losses: "
                               "set objective.report_aux_loss: true (and model.aux_heads: true)")
        j = ctx.sensors.index(group[len(SENSOR_PREFIX):])
        losses = batch.extras["aux_loss"][batch.senders[group], j].astype(np.float64)
        return evidence_weights(w, losses, self.p.temperature)

    @staticmethod
    def check_scenario(params: TideAggregationParams, scenario: Scenario,
                       sensors: tuple[str, ...] | None) -> list[str]:
        if params.weighting == "evidence" and not (
                scenario.objective.name == "tide"
                and scenario.objective.params().get("report_aux_loss")):
            return ["aggregation.weighting: evidence needs the aux-head losses: use objective "
                    "tide with report_aux_loss: true"]
        return []

    def extras(self, round: int) -> dict[str, np.ndarray]:
        """Prototypes (and which classes have one) once the warm-up is over.

        Memoised per round: the server asks again after aggregating to count the bytes, and must
        count what was actually sent, not the prototypes this round has just updated.
        """
        if self._payload is not None and self._payload[0] == round:
            return self._payload[1]
        payload: dict[str, np.ndarray] = {}
        if round > self.p.warmup and self.prototypes is not None \
                and self.has_prototype is not None:
            payload = {"prototypes": self.prototypes.copy(),
                       "prototype_mask": self.has_prototype.astype(np.float32)}
        self._payload = (round, payload)
        return payload

    def state_dict(self) -> dict[str, Any]:
        return {"prototypes": self.prototypes, "has_prototype": self.has_prototype}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.prototypes = state.get("prototypes")
        self.has_prototype = state.get("has_prototype")
        self._payload = None
