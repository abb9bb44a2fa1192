"""TIDE's local objective: L_task + µ L_prox + λ_cs L_cs + λ_p L_p + λ_h L_h, modality dropout,
and the per-device reports the server needs (class means of z for prototypes; aux-head losses
for evidence-weighted merging).

Where the device-local residual adapter learns (`adapter_path`; docs/methods/tide.md):
- ``personal`` (default): L_task = CE(H(z), y) + CE(H̄(z̄ + A(z̄)), y). The global parameters
  (encoders, fusion, heads) learn on the adapter-free path, exactly the model the server
  evaluates; the adapter learns on a personal path built from detached values of z and of the
  task head (`MultimodalNet.forward(split_adapter=True)`), so no gradient of it reaches a
  global parameter. The adapter is used where a device predicts for itself (per-device
  evaluation, `eval.scope: devices|both`).
- ``joint`` (the earlier rule, kept to measure the change): L_task = CE(H(z + A(z)), y), one
  path through the adapter for everything. The shared head then learns on adapted z but is
  evaluated on plain z; on UCI-HAR the adapters of often-selected devices grew to ~0.8 |z| and
  the global accuracy peaked early and fell.

Choices where the paper is open (docs/methods/tide.md, "Where raymm departs from the paper"):
- L_prox = µ·||θ - θ[t]||² (no ½, unlike the `ce` objective's FedProx),
  over the trained global groups only: the device-local adapter has no global value.
- "Sensors the device holds" for L_h and L_cs means the held sensors whose input is present in
  the batch: a batch where modality dropout zeroed a sensor leaves that sensor out of L_h and of
  every L_cs pair, because a zero-input branch carries no signal (the reason for L_cs = 0 on
  single-sensor devices). In every other batch this is exactly the held set.
- L_p and the reported class means use z before the residual adapter (`ModelOutput.z_base`):
  prototypes describe the global fused representation, which is evaluated without the adapter.
Everything is written with masks, not data-dependent branches, and every term honours
`LossInputs.weight` (padding rows of a short last batch count nowhere, and are neither anchors
nor candidates of L_cs), so `raymm.training.lockstep` trains TIDE devices in lock-step. With
`weight=None` (the sequential path) each term computes exactly what it did before.

The loss after the encoders is written out a second time, with its reverse pass, for lock-step
programs (`policies/objective/tide_closed_form.py`): a change to a term here goes there too, or
`tests/unit/policies/objective/test_tide_closed_form.py` fails.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field
from torch import Tensor

from raymm.config.schema import Scenario
from raymm.models import RaymmNet
from raymm.protocol.losses import contrastive_ce, mean_cross_entropy
from raymm.protocol.registry import OBJECTIVES
from raymm.protocol.seams import LossInputs, Objective

#: logit given to classes without a prototype: far below cos/κ ≥ -1/κ, yet finite so that a
#: zero weight times the loss stays zero (an infinite logit would give NaN gradients)
NO_PROTOTYPE_LOGIT = -1e4


class TideObjectiveParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    mu: float = Field(default=0.01, ge=0)
    lambda_cs: float = Field(default=0.1, ge=0)
    lambda_p: float = Field(default=0.1, ge=0)
    lambda_h: float = Field(default=0.3, ge=0)
    kappa_c: float = Field(default=0.3, gt=0)
    kappa_p: float = Field(default=0.3, gt=0)
    #: share of batches in which one random held sensor is zeroed (devices with ≥ 2 sensors)
    dropout: float = Field(default=0.2, ge=0, le=1)
    #: train the device-local residual adapter (needs model.adapter: true)
    adapter: bool = True
    #: where the adapter learns: "personal" = on its own path, from detached z and head values,
    #: while the global parameters learn adapter-free (as evaluated); "joint" = the task head
    #: is trained on z + A(z) (the earlier rule; see the module docstring)
    adapter_path: Literal["personal", "joint"] = "personal"
    #: report each held sensor's aux-head loss (for evidence-weighted merging)
    report_aux_loss: bool = False


def batch_presence(present: Tensor, weight: Tensor | None = None) -> Tensor:
    """[M] float: 1 for a sensor present in every real sample of the batch (padding rows,
    weight 0, do not count)."""
    if weight is not None:
        present = torch.where(weight[:, None] > 0, present, torch.ones_like(present))
    return present.amin(dim=0)


def aux_head_loss(sensor_logits: dict[str, Tensor], y: Tensor, present: Tensor,
                  weight: Tensor | None = None) -> Tensor:
    """L_h: mean cross-entropy of the auxiliary heads of the sensors present in the batch."""
    per = torch.stack([mean_cross_entropy(sensor_logits[m], y, weight) for m in sensor_logits])
    w = batch_presence(present, weight)
    return (per * w).sum() / w.sum().clamp(min=1.0)


def info_nce_pair(ea: Tensor, eb: Tensor, kappa: float, weight: Tensor | None = None
                  ) -> Tensor:
    """Symmetric InfoNCE of two views of the same J samples, ω_jj' = cos(ea_j, eb_j') / κ.
    With `weight`, padding rows are neither candidates (their logits get
    `raymm.protocol.losses.PADDING_LOGIT`) nor anchors (weighted mean over anchors)."""
    omega = F.normalize(ea, dim=1) @ F.normalize(eb, dim=1).T / kappa
    return 0.5 * (contrastive_ce(omega, weight) + contrastive_ce(omega.T, weight))


def cross_sensor_loss(embeddings: dict[str, Tensor], present: Tensor, kappa: float,
                      weight: Tensor | None = None) -> Tensor:
    """L_cs: mean of the pair losses over pairs of sensors both present in the batch; 0 when
    fewer than two are (a single-sensor device). Presence is a tensor mask, not a branch:
    under vmap each device's modality dropout may differ."""
    names = list(embeddings)
    w_s = batch_presence(present, weight)
    total = present.new_zeros(())
    pairs = present.new_zeros(())
    for a in range(len(names)):
        for b in range(a + 1, len(names)):
            w = w_s[a] * w_s[b]
            total = total + w * info_nce_pair(embeddings[names[a]], embeddings[names[b]], kappa,
                                              weight)
            pairs = pairs + w
    return total / pairs.clamp(min=1.0)


def prototype_loss(z: Tensor, y: Tensor, prototypes: Tensor, mask: Tensor,
                   kappa: float, weight: Tensor | None = None) -> Tensor:
    """L_p: -mean_j log softmax_y(cos(z_j, p_y)/κ)[y_j], the softmax over the classes that have a
    prototype (`mask`), the mean over (real) samples whose class has one."""
    # a contiguous right operand: vmap folds every device's rows into one product with the
    # shared prototypes, and MKL picks its kernel for a transposed one by the row count, so a
    # device's bits then depend on the devices beside it (tests/needs.py)
    logits = F.normalize(z, dim=1) @ F.normalize(prototypes, dim=1).T.contiguous() / kappa
    logits = logits.masked_fill(mask[None, :] <= 0, NO_PROTOTYPE_LOGIT)
    per = F.cross_entropy(logits, y, reduction="none")
    w = mask[y] if weight is None else mask[y] * weight
    return (per * w).sum() / w.sum().clamp(min=1.0)


def global_names(trainable: Iterable[str]) -> tuple[str, ...]:
    """The trained parameters that have a global value (not the device-local adapter)."""
    return tuple(n for n in trainable if not n.startswith("adapter."))


def prox_global(trainable: Mapping[str, Tensor], anchor: Mapping[str, Tensor]) -> Tensor:
    """||θ - θ[t]||² over the trained parameters that have a global value (`global_names`)."""
    terms = [((trainable[n] - anchor[n]) ** 2).sum() for n in global_names(trainable)]
    return torch.stack(terms).sum()


@OBJECTIVES.register("tide")
class TideObjective(Objective):
    Params = TideObjectiveParams
    #: honours `inp.weight` and has no value-dependent Python branches: raymm.training.lockstep may
    #: train many devices at once with it
    vectorisable = True
    #: reads held sensors from `inp.present` only; its proximal term is zero for a parameter
    #: at its received value: devices of every sensor set share a lock-step program
    mixes_sensor_sets = True

    def __init__(self, params: TideObjectiveParams) -> None:
        self.p = params
        self.uses_adapter = params.adapter
        #: trainers ask the model for the split paths (`forward(split_adapter=True)`)
        self.split_adapter = params.adapter and params.adapter_path == "personal"

    @staticmethod
    def model_needs(params: TideObjectiveParams) -> frozenset[str]:
        p = params
        return frozenset({"sensor_groups"} | ({"sensor_heads"} if p.lambda_h > 0 else set())
                         | ({"fused"} if p.lambda_p > 0 else set())
                         | ({"adapter"} if p.adapter else set()))

    @staticmethod
    def check_scenario(params: TideObjectiveParams, scenario: Scenario,
                       sensors: tuple[str, ...] | None) -> list[str]:
        """Cross-field rules checked before anything runs (a device that raises mid-run would
        only be counted as failed)."""
        problems = []
        if not scenario.model.aux_heads and (params.lambda_h > 0 or params.report_aux_loss):
            problems.append("objective.lambda_h/report_aux_loss: the auxiliary-head loss needs "
                            "model.aux_heads: true (or set lambda_h: 0, report_aux_loss: false)")
        if params.adapter and not scenario.model.adapter:
            problems.append("objective.adapter: needs model.adapter: true (or adapter: false)")
        if scenario.model.fusion != "concat" and (params.lambda_p > 0 or params.adapter):
            problems.append("objective: prototypes and the adapter need model.fusion: concat")
        return problems

    def proximal(self, trainable: Sequence[str]) -> tuple[float, tuple[str, ...]]:
        """µ L_prox, which a lock-step program may add outside `loss`."""
        return (self.p.mu, global_names(trainable)) if self.p.mu > 0 else (0.0, ())

    def loss(self, inp: LossInputs) -> Tensor:
        p, out, w = self.p, inp.out, inp.weight
        loss = mean_cross_entropy(out.logits, inp.y, w)
        if out.personal_logits is not None:  # the adapter's own path (split_adapter)
            loss = loss + mean_cross_entropy(out.personal_logits, inp.y, w)
        if p.mu > 0 and not inp.proximal_outside:
            loss = loss + p.mu * prox_global(inp.trainable, inp.anchor)
        if p.lambda_h > 0:
            loss = loss + p.lambda_h * aux_head_loss(out.sensor_logits, inp.y, inp.present, w)
        if p.lambda_cs > 0:
            loss = loss + p.lambda_cs * cross_sensor_loss(out.embeddings, inp.present, p.kappa_c,
                                                          w)
        if p.lambda_p > 0 and "prototypes" in inp.extras:
            assert out.z_base is not None
            loss = loss + p.lambda_p * prototype_loss(
                out.z_base, inp.y, inp.extras["prototypes"], inp.extras["prototype_mask"],
                p.kappa_p, w)
        return loss

    def augment(self, xb: dict[str, Tensor], present: Tensor, held: tuple[str, ...],
                sensors: tuple[str, ...], gen: torch.Generator) -> tuple[dict[str, Tensor], Tensor]:
        """Modality dropout: with probability `dropout`, zero one held sensor (uniformly
        chosen) in this batch. Both draws are made for every batch of a multi-sensor device, so
        the stream never depends on an earlier outcome. Inputs are not mutated."""
        if len(held) < 2 or self.p.dropout <= 0:
            return xb, present
        draw = float(torch.rand((), generator=gen))
        pick = int(torch.randint(len(held), (), generator=gen))
        if draw >= self.p.dropout:
            return xb, present
        m = held[pick]
        out = dict(xb)
        out[m] = torch.zeros_like(xb[m])
        keep = torch.ones(present.shape[1])
        keep[sensors.index(m)] = 0.0
        return out, present * keep

    @torch.no_grad()
    def device_extras(self, model: RaymmNet, xs: dict[str, Tensor], y: Tensor,
                      held_t: Tensor, use_adapter: bool) -> dict[str, np.ndarray]:
        """After local training, on the device's whole dataset: per-class mean of z (float32
        [C, F]) and class counts (int32 [C]) when prototypes are on; each sensor's aux-head
        loss (float32 [M], NaN for sensors not held) when asked for."""
        p = self.p
        if p.lambda_p <= 0 and not p.report_aux_loss:
            return {}
        out = model(xs, held_t.expand(y.shape[0], -1), use_adapter=use_adapter)
        extras: dict[str, np.ndarray] = {}
        if p.lambda_p > 0:
            assert out.z_base is not None
            onehot = F.one_hot(y, out.logits.shape[1]).to(out.z_base.dtype)   # [n, C]
            counts = onehot.sum(dim=0)
            means = onehot.T @ out.z_base / counts.clamp(min=1.0)[:, None]
            extras["class_means"] = means.numpy().astype(np.float32)
            extras["class_counts"] = counts.numpy().astype(np.int32)
        if p.report_aux_loss:
            losses = [float(F.cross_entropy(out.sensor_logits[m], y)) if h > 0 else np.nan
                      for m, h in zip(out.sensor_logits, held_t.tolist())]
            extras["aux_loss"] = np.asarray(losses, dtype=np.float32)
        return extras
