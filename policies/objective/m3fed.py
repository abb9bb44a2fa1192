"""M3Fed's local update: a Hessian-free Per-FedAvg meta step with a consensus term on G
(Li, Qi, Zhang, Xu, ACM MM 2024; docs/methods/m3fed.md).

The loss of one minibatch D is L(θ; D) = CE + λ·MSE(G, G_received), G the model's consensus
projection (`model.consensus`, parameter `consensus.weight`) and G_received the consensus the
device downloaded this round. One meta step takes three minibatches D1, D2, D3:

    θ' = θ - α·∇L(θ; D1)
    v  = ∇L(θ'; D2)
    h  = (∇L(θ + δv; D3) - ∇L(θ - δv; D3)) / 2δ        (≈ H(θ; D3)·v, central differences)
    θ ← θ - β·(v - α·h)

the first-order gradients clipped to a joint L2 norm of `clip_norm` as the released code does.
The rule replaces raymm's optimizer step (`Objective.local_steps`): sequential path only.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, TypeVar

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field
from torch import Tensor

from raymm.protocol.losses import mean_cross_entropy
from raymm.protocol.registry import OBJECTIVES
from raymm.protocol.seams import GradientFn, LossInputs, Objective

#: the consensus projection's parameter in raymm's network (`model.consensus`)
CONSENSUS = "consensus.weight"

Tensors = dict[str, Tensor]
Grads = Mapping[str, Tensor | None]
_Batch = TypeVar("_Batch")


class M3FedLossParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    #: α, the inner (adaptation) step size (the released code's default)
    alpha: float = Field(default=1e-3, gt=0)
    #: β, the outer (meta) step size (the released code's default)
    beta: float = Field(default=1e-4, gt=0)
    #: δ, the finite-difference step of the Hessian-vector product
    delta: float = Field(default=1e-5, gt=0)
    #: λ, the weight of MSE(G, G_received) in the loss (0.6 in the released code)
    lambda_g: float = Field(default=0.6, ge=0)
    #: the first-order gradients are scaled to a joint L2 norm of at most this (as
    #: torch.nn.utils.clip_grad_norm_ does in the released code); None: no clipping
    clip_norm: float | None = Field(default=1.0, gt=0)


def clip_grads(grads: Grads, max_norm: float | None) -> Tensors:
    """`grads` without its None entries and, given `max_norm`, scaled by
    min(1, max_norm / (‖g‖ + 1e-6)), ‖g‖ their joint L2 norm (torch's clip_grad_norm_)."""
    kept = {n: g for n, g in grads.items() if g is not None}
    if max_norm is None or not kept:
        return kept
    total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g)
                                                  for g in kept.values()]))
    scale = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    return {n: g * scale for n, g in kept.items()}


def moved(params: Tensors, direction: Mapping[str, Tensor], step: float) -> Tensors:
    """θ + step·d as new leaf tensors (a parameter without a direction stays)."""
    with torch.no_grad():
        return {n: (p + step * direction[n] if n in direction else p).detach()
                for n, p in params.items()}


def meta_step(params: Tensors, d1: Any, d2: Any, d3: Any, grads_of: GradientFn,
              p: M3FedLossParams) -> tuple[Tensors, Tensor]:
    """One Hessian-free Per-FedAvg step on minibatches d1, d2, d3 (the module docstring):
    (new parameters, L(θ; d1))."""
    loss, g1 = grads_of(params, d1)
    adapted = moved(params, clip_grads(g1, p.clip_norm), -p.alpha)        # θ'
    _, g2 = grads_of(adapted, d2)
    v = clip_grads(g2, p.clip_norm)
    _, g_plus = grads_of(moved(params, v, p.delta), d3)
    _, g_minus = grads_of(moved(params, v, -p.delta), d3)
    with torch.no_grad():
        step = {}
        for n, vn in v.items():
            gp, gm = g_plus.get(n), g_minus.get(n)
            hv = (gp - gm) / (2 * p.delta) if gp is not None and gm is not None \
                else torch.zeros_like(vn)
            step[n] = vn - p.alpha * hv
    return moved(params, step, -p.beta), loss


def triples(batches: Iterator[_Batch]) -> Iterator[tuple[_Batch, _Batch, _Batch]]:
    """Consecutive (D1, D2, D3) of the stream; a last incomplete group is completed from its
    own start ((b, b, b) or (b1, b2, b1)), so a device with one or two minibatches still
    takes a step."""
    group: list[_Batch] = []
    for b in batches:
        group.append(b)
        if len(group) == 3:
            yield group[0], group[1], group[2]
            group = []
    if group:
        yield group[0], group[-1] if len(group) > 1 else group[0], group[0]


@OBJECTIVES.register("m3fed")
class M3FedLoss(Objective):
    """Cross-entropy plus λ·MSE(G, G_received), trained by the meta step above."""

    Params = M3FedLossParams
    # not `vectorisable`: the update rule is its own (`local_steps`), on the sequential path

    def __init__(self, params: M3FedLossParams) -> None:
        self.p = params

    def loss(self, inp: LossInputs) -> Tensor:
        loss = mean_cross_entropy(inp.out.logits, inp.y, inp.weight)
        g = inp.trainable.get(CONSENSUS)
        if g is not None and self.p.lambda_g > 0:
            loss = loss + self.p.lambda_g * F.mse_loss(g, inp.anchor[CONSENSUS])
        return loss

    def local_steps(self, params: Tensors, batches: Iterator[Any], grads_of: GradientFn
                    ) -> tuple[Tensors, list[Tensor]]:
        """A meta step per three minibatches, over every epoch's minibatches in order."""
        losses = []
        for d1, d2, d3 in triples(batches):
            params, loss = meta_step(params, d1, d2, d3, grads_of, self.p)
            losses.append(loss)
        return params, losses
