"""FedProto's device side (Tan et al., AAAI 2022): the device's own model, trained with
cross-entropy plus a pull of its representations toward the server's class prototypes.

    L = CE(logits, y) + λ · Σ_s mean_b 1[P_s has class y_b] · mean_f (r_s(x_b) - P_s[y_b])_f²

Prototype spaces `s` are where the model's penultimate representation lives (see
`prototype_spaces`): the fused representation z for a model with a fusion layer (one space,
"z"); each held sensor's embedding for late fusion by summed logits (one space per sensor, its
head being that sensor's classifier). The squared distance is averaged over the feature
dimension and over the whole batch, samples of a class without a global prototype adding 0
(the authors' code: `MSELoss` of the representation against the prototype, the representation
itself standing in for a missing one); λ = 1 is that code's default `ld`.

After local training the device reports, per space and class, the mean representation over its
training samples with the trained model, and the class counts (`proto_means/<s>`,
`proto_counts/<s>`; zeros for a class it lacks, and for a sensor space it does not hold). The
model never leaves the device (`training.exchange: personal`). Evaluation: the device's own
model (the logits) and, as the paper reports, the nearest global prototype (`eval_predict`):
argmin_c Σ_s ||r_s(x) - P_s[c]||² over the spaces present, classes without a prototype excluded.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field
from torch import Tensor

from raymm.config.schema import Scenario
from raymm.models import RaymmNet
from raymm.models.network import ModelOutput
from raymm.protocol.losses import mean_cross_entropy
from raymm.protocol.registry import OBJECTIVES
from raymm.protocol.seams import LossInputs, Objective

Z = "z"
MEANS, COUNTS = "proto_means/", "proto_counts/"
PROTO, MASK = "proto/", "proto_mask/"

#: distance given to classes without a prototype in the nearest-prototype prediction
NO_PROTOTYPE = 1e30


class FedProtoParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    #: λ, the weight of the prototype distance (the authors' `ld`)
    lam: float = Field(default=1.0, ge=0)


def prototype_spaces(out: ModelOutput, held: tuple[str, ...]) -> dict[str, Tensor]:
    """Representation per prototype space: {"z": z before any adapter} for a fusion model,
    else {m: embedding of m} for every held sensor m (late fusion)."""
    if out.z_base is not None:
        return {Z: out.z_base}
    return {m: out.embeddings[m] for m in held}


def space_names(model: RaymmNet) -> tuple[str, ...]:
    """Every prototype space the model has (a device reports all of them, zero for the ones it
    does not hold, so every device's extras have the same keys)."""
    return (Z,) if model.fusion is not None else tuple(model.sensors)


def prototype_distance(rep: Tensor, y: Tensor, protos: Tensor, mask: Tensor,
                       weight: Tensor | None = None) -> Tensor:
    """mean_b 1[mask[y_b]]·mean_f (rep_b - protos[y_b])²: [B, F], [B], [C, F], [C] -> scalar.
    With `weight` (padding rows 0), a weighted mean over the real rows."""
    per = ((rep - protos[y]) ** 2).mean(dim=1) * mask[y]
    if weight is None:
        return per.mean()
    return (per * weight).sum() / weight.sum()


def class_means(rep: Tensor, y: Tensor, classes: int) -> tuple[np.ndarray, np.ndarray]:
    """(per-class mean of rep, float32 [C, F]; class counts, int32 [C]); zero rows for absent
    classes."""
    onehot = F.one_hot(y, classes).to(rep.dtype)
    counts = onehot.sum(dim=0)
    means = onehot.T @ rep / counts.clamp(min=1.0)[:, None]
    return means.numpy().astype(np.float32), counts.numpy().astype(np.int32)


def nearest_prototype(spaces: dict[str, Tensor], protos: dict[str, Tensor],
                      masks: dict[str, Tensor]) -> Tensor:
    """argmin_c Σ_s ||r_s - P_s[c]||² over the given spaces; a class is a candidate only when
    every given space has a prototype for it."""
    total: Tensor | None = None
    for s, rep in spaces.items():
        d = torch.cdist(rep, protos[s]) ** 2
        d = d + (1.0 - masks[s])[None, :] * NO_PROTOTYPE
        total = d if total is None else total + d
    assert total is not None, "nearest_prototype needs at least one space"
    return total.argmin(dim=1)


@OBJECTIVES.register("fedproto")
class FedProtoObjective(Objective):
    """Cross-entropy plus λ times the squared distance of the representation to its class's
    global prototype; reports local prototypes; predicts also by nearest prototype."""

    Params = FedProtoParams
    uses_adapter = False

    def __init__(self, params: FedProtoParams | None = None) -> None:
        self.p = params or FedProtoParams()

    @staticmethod
    def model_needs(params: FedProtoParams) -> frozenset[str]:
        return frozenset({"sensor_groups"})

    @staticmethod
    def check_scenario(params: FedProtoParams, scenario: Scenario,
                       sensors: tuple[str, ...] | None) -> list[str]:
        problems = []
        if scenario.aggregation.name != "fedproto":
            problems.append("objective.name: fedproto reports prototypes that only aggregation "
                            "fedproto averages (got aggregation "
                            f"{scenario.aggregation.name!r})")
        if scenario.model.adapter:
            problems.append("model.adapter: FedProto's whole model is the device's own; the "
                            "residual adapter has no role in it (set model.adapter: false)")
        return problems

    def loss(self, inp: LossInputs) -> Tensor:
        loss = mean_cross_entropy(inp.out.logits, inp.y, inp.weight)
        if self.p.lam <= 0:
            return loss
        for s, rep in prototype_spaces(inp.out, inp.held).items():
            if PROTO + s in inp.extras:
                loss = loss + self.p.lam * prototype_distance(
                    rep, inp.y, inp.extras[PROTO + s], inp.extras[MASK + s], inp.weight)
        return loss

    @torch.no_grad()
    def device_extras(self, model: RaymmNet, xs: dict[str, Tensor], y: Tensor,
                      held_t: Tensor, use_adapter: bool) -> dict[str, np.ndarray]:
        """Local prototypes of the trained model over the device's training samples."""
        held = tuple(m for m, h in zip(model.sensors, held_t.tolist()) if h > 0)
        out = model(xs, held_t.expand(y.shape[0], -1))
        spaces = prototype_spaces(out, held)
        classes = out.logits.shape[1]
        extras: dict[str, np.ndarray] = {}
        for s in space_names(model):
            if s in spaces:
                means, counts = class_means(spaces[s], y, classes)
            else:  # a sensor the device does not hold: nothing to report (0 bytes counted)
                dim = int(out.embeddings[s].shape[1])
                means = np.zeros((classes, dim), np.float32)
                counts = np.zeros(classes, np.int32)
            extras[MEANS + s], extras[COUNTS + s] = means, counts
        return extras

    def eval_predict(self, out: ModelOutput, held: tuple[str, ...],
                     extras: dict[str, Tensor]) -> dict[str, Tensor]:
        """Predictions besides the logits' for per-device evaluation: `proto`, the nearest
        global prototype (empty before the server has any)."""
        spaces = prototype_spaces(out, held)
        if not spaces or any(PROTO + s not in extras for s in spaces):
            return {}
        return {"proto": nearest_prototype(
            spaces, {s: extras[PROTO + s] for s in spaces},
            {s: extras[MASK + s] for s in spaces})}
