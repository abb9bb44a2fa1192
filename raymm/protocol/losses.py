"""Loss building blocks that objectives compose (`policies/objective/`).

Each one honours the lock-step contract of `raymm.training.local_update`: a pure function of
tensors, vmappable, and with `weight` (float [B], 1 = real sample, 0 = padding of a short last
batch; None on the sequential path, where every row is real) kept out of every reduction over
samples.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor

if TYPE_CHECKING:
    from raymm.protocol.seams import LossInputs


def sample_mean(values: Tensor, weight: Tensor | None) -> Tensor:
    """Mean of per-sample `values` [B, ...] over the batch, padding rows (weight 0) excluded."""
    if weight is None:
        return values.mean(dim=0)
    w = weight.reshape((-1,) + (1,) * (values.dim() - 1))
    return (values * w).sum(dim=0) / weight.sum()


def mean_cross_entropy(logits: Tensor, y: Tensor, weight: Tensor | None) -> Tensor:
    """Cross-entropy averaged over the batch, padding rows (weight 0) excluded."""
    if weight is None:
        return F.cross_entropy(logits, y)
    return sample_mean(cross_entropy_rows(logits, y), weight)


def cross_entropy_rows(logits: Tensor, y: Tensor) -> Tensor:
    """Per-row cross-entropy of logits [B, C] and labels [B]: `F.cross_entropy(logits, y,
    reduction="none")` up to float32 rounding. On CPU it is written out as elementwise
    operations: torch's CPU log-softmax vectorises along the class axis, so with a handful of
    classes it costs several times these operations, forward and backward (and the lock-step
    path puts every device's rows through it)."""
    if logits.device.type != "cpu":
        return F.cross_entropy(logits, y, reduction="none")
    z = logits - logits.amax(dim=1, keepdim=True).detach()  # log-sum-exp is shift-invariant
    return z.exp().sum(dim=1).log() - z.gather(1, y[:, None])[:, 0]


def cross_entropy_with_grad(logits: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
    """For a hand-written reverse pass: the per-row cross-entropy `[..., B]` of logits
    `[..., B, C]` (as `cross_entropy_rows` computes it, the largest logit subtracted) and its
    gradient with respect to the logits, softmax minus one-hot `[..., B, C]` (a fresh tensor
    the caller may scale in place)."""
    z = logits - logits.amax(dim=-1, keepdim=True)
    e = z.exp()
    total = e.sum(dim=-1, keepdim=True)
    rows = total.log().squeeze(-1) - z.gather(-1, y.unsqueeze(-1)).squeeze(-1)
    grad = e.div_(total)
    grad.scatter_add_(-1, y.unsqueeze(-1), torch.full_like(grad[..., :1], -1.0))
    return rows, grad


#: logit offset that takes a padding row out of a contrastive loss's candidates: exp()
#: underflows to 0, yet it is finite so that 0-weight rows keep finite gradients (an infinite
#: logit would give NaN)
PADDING_LOGIT = -1e4


def contrastive_ce(sim: Tensor, weight: Tensor | None) -> Tensor:
    """InfoNCE core: mean_b -log softmax_b'(sim[b, b'])[b] for a square similarity [B, B] of
    anchors (rows) against candidates (columns), positives on the diagonal. With `weight`,
    padding rows are neither candidates (their column gets `PADDING_LOGIT`) nor anchors."""
    target = torch.arange(sim.shape[0], device=sim.device)
    if weight is not None:
        sim = sim + ((1.0 - weight) * PADDING_LOGIT)[None, :]
    return mean_cross_entropy(sim, target, weight)


def prox_term(inp: LossInputs) -> Tensor:
    """Squared L2 distance of the trained parameters to the ones received this round."""
    total = None
    for name, p in inp.trainable.items():
        d = ((p - inp.anchor[name]) ** 2).sum()
        total = d if total is None else total + d
    assert total is not None, "prox_term needs at least one trainable parameter"
    return total
