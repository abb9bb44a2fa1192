"""Worked example (docs/adding-a-policy.md): an aggregator that broadcasts an extra, and the
objective that reads it on the devices.

FedProx with a proximal strength µ the server sets each round. After averaging, the server
compares how far the devices' models lie from their mean (the spread) with how far the mean
moved: devices that disagree more than they move together are pulled harder toward the model
they received in the next round, µ = mu · spread / step (at most `max_mu`). µ travels with the
model as the extra `adaptive_prox/mu` (counted as downlink); the objective adds
(µ/2)·||θ - θ_received||² to the cross-entropy. µ is server state: it is checkpointed, so a
resumed run sends the µ the uninterrupted one would have.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field
from torch import Tensor

from raymm.config.schema import Scenario
from raymm.protocol.losses import mean_cross_entropy, prox_term
from raymm.protocol.messages import UpdateBatch
from raymm.protocol.registry import AGGREGATORS, OBJECTIVES
from raymm.protocol.seams import AggregationContext, Aggregator, LossInputs, NoParams, Objective

#: the broadcast extra's name
MU = "adaptive_prox/mu"


class AdaptiveProxParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    #: µ of the first round, and the scale of later ones (µ = mu · spread / step)
    mu: float = Field(default=0.01, ge=0)
    #: the largest µ ever sent
    max_mu: float = Field(default=1.0, ge=0)


@AGGREGATORS.register("adaptive_prox")
class AdaptiveProx(Aggregator):
    """Sample-weighted mean of each group (FedAvg), and the µ of the next round, broadcast."""

    Params = AdaptiveProxParams
    # not `combinable`: the spread reads every device's own row

    def __init__(self, params: AdaptiveProxParams) -> None:
        self.scale, self.max_mu = params.mu, params.max_mu
        self.mu = params.mu

    def aggregate(self, params: dict[str, np.ndarray], batch: UpdateBatch,
                  ctx: AggregationContext) -> dict[str, np.ndarray]:
        out = dict(params)  # a group nobody sent keeps its vector
        spread = step = 0.0
        for g, rows in batch.updates.items():
            x, w = rows.astype(np.float64), batch.group_weights(g)
            mean = (x * w[:, None]).sum(axis=0) / w.sum()
            spread += float((w * ((x - mean) ** 2).sum(axis=1)).sum() / w.sum())
            step += float(((mean - params[g]) ** 2).sum())
            out[g] = mean.astype(np.float32)
        # the next round's µ (kept when the model did not move): `extras` must not change
        # between a round's plan and the count of its downlink, both before `aggregate`
        if step > 0:
            self.mu = min(self.max_mu, self.scale * spread / step)
        return out

    def extras(self, round: int) -> dict[str, np.ndarray]:
        return {MU: np.array([self.mu], np.float32)}

    def round_stats(self) -> dict[str, float]:
        return {"prox_mu_next": self.mu}

    def state_dict(self) -> dict[str, Any]:
        return {"mu": self.mu}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.mu = float(state["mu"])


@OBJECTIVES.register("adaptive_prox")
class AdaptiveProxLoss(Objective):
    """Cross-entropy plus (µ/2)·||θ - θ_received||², µ from the server's broadcast."""

    #: no Python branch on values, honours `inp.weight`: devices may train in lock-step
    vectorisable = True

    def __init__(self, params: NoParams) -> None:  # built as cls(Params()): it takes none
        pass

    @staticmethod
    def check_scenario(params: BaseModel, scenario: Scenario, sensors: tuple[str, ...] | None
                       ) -> list[str]:
        if scenario.aggregation.name != "adaptive_prox":
            return ["objective.name: adaptive_prox reads µ from the broadcast of aggregation "
                    f"adaptive_prox (got aggregation {scenario.aggregation.name!r})"]
        return []

    def loss(self, inp: LossInputs) -> Tensor:
        mu = inp.extras[MU].reshape(())  # one value for every device: a broadcast
        return mean_cross_entropy(inp.out.logits, inp.y, inp.weight) + 0.5 * mu * prox_term(inp)
