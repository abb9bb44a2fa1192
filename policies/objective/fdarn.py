"""FDARN's local loss (Yang, Xiong, Huang, Xu, AAAI 2022): a shared (modality-agnostic) and a
private (modality-specific) network whose logits are summed, their codes kept apart and told
apart by a modality discriminator on a hyper-sphere (docs/methods/fdarn.md).

L = CE(f_S + f_P, y) + λ_diff·mean((P̃ᵀS̃)²) + λ_dom·CE(Arc(D(p)), d)
    + λ_adv·CE(Arc(D(GRL_c(s))), d) + λ_spread·spread(W_arc)

p, s: the private and the shared code (`ModelOutput.private_code`, `z` or the sensors' masked
embeddings); d: the sample's sensor set (its modality domain); D: the discriminator layer;
Arc: ArcFace logits (scale `arc_scale`, margin `arc_margin`) against the class weights W_arc;
GRL_c: identity forward, −c × the gradient backward, c rising with the run's progress.
The math is pure functions below, testable without a model.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field
from torch import Tensor

from raymm.config.schema import Scenario
from raymm.errors import refuse
from raymm.models.network import code_of
from raymm.protocol.losses import mean_cross_entropy
from raymm.protocol.registry import OBJECTIVES
from raymm.protocol.seams import LossInputs, Objective

#: the discriminator's parameters as the model names them (`model.discriminator`)
LAYER_W, LAYER_B, ARC = "discriminator.layer.weight", "discriminator.layer.bias", \
    "discriminator.arc"


def orthogonality(private: Tensor, shared: Tensor, weight: Tensor | None = None) -> Tensor:
    """mean((P̃ᵀS̃)²): P̃, S̃ the codes [B, K] with rows scaled to unit length (the norms held
    constant, as FDARN's difference loss does); padding rows (weight 0) left out."""
    def unit(x: Tensor) -> Tensor:
        x = x / (x.norm(dim=1, keepdim=True).detach() + 1e-6)
        return x if weight is None else x * weight[:, None]
    return (unit(private).T @ unit(shared)).pow(2).mean()


def reverse_gradient(x: Tensor, coef: Tensor | float) -> Tensor:
    """The gradient-reversal layer: `x` forward, −coef × the incoming gradient backward.
    Written with `detach` rather than a custom autograd Function, so that it runs under vmap
    (lock-step training): x.detach() − x is exactly 0 forward."""
    held = x.detach()
    return held + coef * (held - x)


def grl_coefficient(progress: float, gamma: float = 10.0) -> float:
    """DANN's schedule 2 / (1 + e^(−γ·p)) − 1 of the training progress p ∈ [0, 1]."""
    return 2.0 / (1.0 + math.exp(-gamma * progress)) - 1.0


def arcface_logits(features: Tensor, weights: Tensor, labels: Tensor, scale: float,
                   margin: float) -> Tensor:
    """ArcFace: s·cos θ_k for every class, the label's angle widened by the margin m,
    s·cos(θ_y + m) (where θ_y + m would pass π, s·(cos θ_y − m·sin m) instead, as ArcFace's
    code does). θ_k: the angle between a feature row and class k's weight row."""
    cos = F.normalize(features, dim=1) @ F.normalize(weights, dim=1).T
    sin = (1.0 - cos * cos).clamp(min=1e-9).sqrt()
    widened = cos * math.cos(margin) - sin * math.sin(margin)
    widened = torch.where(cos > math.cos(math.pi - margin), widened,
                          cos - math.sin(math.pi - margin) * margin)
    target = (labels[:, None] == torch.arange(weights.shape[0], device=labels.device)
              ).to(cos.dtype)
    return scale * (target * widened + (1.0 - target) * cos)


def spread_out(weights: Tensor) -> Tensor:
    """Mean over class pairs i ≠ j of (ŵ_i·ŵ_j)²: pushes the ArcFace class weights apart on
    the sphere (0 when they are orthogonal)."""
    w = F.normalize(weights, dim=1)
    gram = w @ w.T
    k = weights.shape[0]
    off = gram - torch.diag_embed(torch.diagonal(gram))
    return off.pow(2).sum() / max(k * (k - 1), 1)


def modality_labels(present: Tensor) -> Tensor:
    """Each sample's modality domain: its set of present sensors as the number
    Σ_j present_j·2^j − 1 (acc = 0, gyro = 1, both = 2 for two sensors; a sample without any
    sensor counts as the first)."""
    bits = 2 ** torch.arange(present.shape[1], device=present.device, dtype=present.dtype)
    return ((present > 0).to(present.dtype) @ bits - 1).clamp(min=0).long()


class FDARNParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    #: weight of the orthogonality of the private and the shared code (FDARN's 0.6)
    diff_weight: float = Field(default=0.6, ge=0)
    #: weight of the private code's modality classification (FDARN's 0.4)
    domain_weight: float = Field(default=0.4, ge=0)
    #: weight of the shared code's adversarial modality classification (FDARN's 0.4)
    adversarial_weight: float = Field(default=0.4, ge=0)
    #: weight of the spread of the ArcFace class weights (FDARN's 0.4)
    spread_weight: float = Field(default=0.4, ge=0)
    #: ArcFace's scale s (FDARN's 72)
    arc_scale: float = Field(default=72.0, gt=0)
    #: ArcFace's additive angular margin m in radians (FDARN's 0.5)
    arc_margin: float = Field(default=0.5, ge=0, lt=math.pi / 2)
    #: γ of the reversal coefficient 2/(1 + e^(−γ·p)) − 1, p = round / grl_rounds (DANN's 10)
    grl_gamma: float = Field(default=10.0, ge=0)
    #: rounds over which the progress p of the reversal's schedule goes from 0 to 1 (and stays
    #: 1 after): 0 = the scenario's `rounds`
    grl_rounds: int = Field(default=0, ge=0)


@OBJECTIVES.register("fdarn")
class FDARN(Objective):
    """FDARN's loss on raymm's network with a private branch (`model.private: [branch]`) and
    a modality discriminator (`model.discriminator`)."""

    Params = FDARNParams
    #: honours `inp.weight`, no Python branch on values, the reversal written without a
    #: custom autograd Function: devices may train in lock-step
    vectorisable = True
    #: reads the sensor sets from `inp.present` only, like `ce`
    mixes_sensor_sets = True

    def __init__(self, params: FDARNParams) -> None:
        self.p = params
        self.rounds = 1

    @staticmethod
    def check_scenario(params: BaseModel, scenario: Scenario, sensors: tuple[str, ...] | None
                       ) -> list[str]:
        m = scenario.model
        problems = []
        if m.factory != "multimodal" or "branch" not in m.private or m.discriminator < 1:
            problems.append("objective.name: fdarn needs raymm's own network with a private "
                            "branch and a modality discriminator (model.factory: multimodal, "
                            "model.private: [branch], model.discriminator: 128; the fdarn "
                            "preset sets them)")
        return problems

    def bind(self, scenario: Scenario, sensors: tuple[str, ...]) -> None:
        problems = self.check_scenario(self.p, scenario, sensors)
        if problems:
            refuse(problems)
        self.rounds = max(1, self.p.grl_rounds or scenario.rounds)

    def coefficient(self, round: int) -> float:
        """The gradient reversal's coefficient in `round` (rising from ~0 to ~1 over the
        run)."""
        return grl_coefficient(min(1.0, round / self.rounds), self.p.grl_gamma)

    def loss(self, inp: LossInputs) -> Tensor:
        out, w, p = inp.out, inp.weight, self.p
        private = out.private_code
        assert private is not None   # check_scenario asks for the branch
        shared = code_of(out.z_base, out.embeddings, inp.present)
        loss = mean_cross_entropy(out.logits, inp.y, w) + \
            p.diff_weight * orthogonality(private, shared, w)
        if ARC not in inp.trainable:   # the discriminator is not trained this round
            return loss
        layer_w, layer_b, arc = inp.trainable[LAYER_W], inp.trainable[LAYER_B], \
            inp.trainable[ARC]
        d = modality_labels(inp.present)

        def domain_ce(code: Tensor) -> Tensor:
            feat = F.relu(F.linear(code, layer_w, layer_b))
            return mean_cross_entropy(arcface_logits(feat, arc, d, p.arc_scale, p.arc_margin),
                                      d, w)

        return loss + p.domain_weight * domain_ce(private) \
            + p.adversarial_weight * domain_ce(
                reverse_gradient(shared, self.coefficient(inp.round))) \
            + p.spread_weight * spread_out(arc)
