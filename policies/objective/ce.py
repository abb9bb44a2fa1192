"""Cross-entropy of the task head, with FedProx's proximal term as an option."""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field
from torch import Tensor

from raymm.protocol.losses import mean_cross_entropy, prox_term
from raymm.protocol.registry import OBJECTIVES
from raymm.protocol.seams import LossInputs, Objective


class CEParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    #: FedProx µ: adds (µ/2)·||θ - θ_received||² (0 = plain cross-entropy)
    mu: float = Field(default=0.0, ge=0)
    #: also train the device-local residual adapter (`model.adapter: true`): personalisation
    #: that never leaves the device and is not used when the global model is evaluated
    adapter: bool = False


@OBJECTIVES.register("ce")
class CrossEntropy(Objective):
    """Cross-entropy of the task head; FedProx's proximal term when mu > 0."""

    Params = CEParams
    #: honours `inp.weight` and has no value-dependent Python branches: raymm.training.lockstep may
    #: train many devices at once with it
    vectorisable = True
    #: reads held sensors from `inp.present` only; its proximal term is zero for a parameter
    #: at its received value: devices of every sensor set share a lock-step program
    mixes_sensor_sets = True

    def __init__(self, params: CEParams) -> None:
        self.mu = params.mu
        self.uses_adapter = params.adapter

    def proximal(self, trainable: Sequence[str]) -> tuple[float, tuple[str, ...]]:
        """FedProx's term, which a lock-step program may add outside `loss`."""
        return (0.5 * self.mu, tuple(trainable)) if self.mu > 0 else (0.0, ())

    def loss(self, inp: LossInputs) -> Tensor:
        loss = mean_cross_entropy(inp.out.logits, inp.y, inp.weight)
        if self.mu > 0 and not inp.proximal_outside:
            loss = loss + 0.5 * self.mu * prox_term(inp)
        return loss
