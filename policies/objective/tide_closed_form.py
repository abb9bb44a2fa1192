"""TIDE's local loss from the embeddings on, with its reverse pass written by hand, registered
for lock-step programs as the `tide` objective's fast path (`raymm.protocol.fast_paths`).

Under `vmap` and autograd the part of a TIDE step after the encoders -- fusion, task head,
per-sensor heads, the adapter's personal path, L_h, L_cs and L_p -- is hundreds of small
operations forward and backward whatever the device count; written out here it is a few
batched products and elementwise terms on `[k, B, ...]` stacks (docs/performance.md,
"Gradients written out"). The same formulas as `policies/objective/tide.py`, term by term and
in its order; the numbers agree to float32 rounding
(`tests/unit/policies/objective/test_tide_closed_form.py`).

It covers the objective with the `personal` adapter path or no adapter, on `MultimodalNet`
with concat fusion (what TIDE's checks require), every parameter it reads trained; otherwise
`TideClosedForm.build` gives None and the program keeps autograd.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from policies.objective.tide import NO_PROTOTYPE_LOGIT, TideObjective, TideObjectiveParams
from raymm.models.network import MultimodalNet, RaymmNet
from raymm.protocol.fast_paths import ClosedForm, register_closed_form
from raymm.protocol.losses import PADDING_LOGIT, cross_entropy_with_grad
from raymm.protocol.seams import Objective

#: F.normalize's default floor on the norm
NORM_EPS = 1e-12


def _linear(x: Tensor, w: Tensor, b: Tensor) -> Tensor:
    """Per device `x @ w.T + b`: x [k, B, in], w [k, out, in], b [k, out]."""
    return torch.baddbmm(b.unsqueeze(1), x, w.transpose(1, 2))


class _Normalized:
    """`F.normalize(x, dim=-1)` and its reverse pass."""

    def __init__(self, x: Tensor) -> None:
        self.x = x
        self.norm: Tensor = x.norm(dim=-1, keepdim=True)
        self.denom: Tensor = self.norm.clamp_min(NORM_EPS)
        self.value = x / self.denom

    def backward(self, grad: Tensor) -> Tensor:
        # x / max(|x|, eps): grad / denom, less the part along x where |x| > eps
        along = (self.value * grad).sum(-1, keepdim=True) / (self.denom * self.norm)
        along = torch.where(self.norm > NORM_EPS, along, torch.zeros_like(along))
        return grad / self.denom - self.x * along


class TideClosedForm:
    """TIDE's loss after the encoders for k devices at once (a `ClosedFormLoss`)."""

    def __init__(self, params: TideObjectiveParams, sensors: tuple[str, ...], adapter: bool
                 ) -> None:
        self.p = params
        self.sensors = sensors
        self.adapter = adapter   # the personal path: H̄(z̄ + A(z̄)) trains the adapter

    @classmethod
    def build(cls, params: TideObjectiveParams, model: torch.nn.Module, trained: Sequence[str],
              use_adapter: bool) -> TideClosedForm | None:
        """None where this does not cover the objective or the model (module docstring)."""
        p = params
        if type(model) is not MultimodalNet or model.fusion is None:
            return None
        adapter = bool(use_adapter and model.adapter is not None)
        if adapter and p.adapter_path != "personal":
            return None
        if p.lambda_h > 0 and model.heads is None:
            return None
        fusion = list(model.fusion.children())
        if len(fusion) != 2 or not isinstance(fusion[0], torch.nn.Linear) or \
                not isinstance(fusion[1], torch.nn.ReLU) or model.head.bias is None:
            return None
        reads = {"fusion.0.weight", "fusion.0.bias", "head.weight", "head.bias"}
        if p.lambda_h > 0:
            reads |= {f"heads.{m}.{k}" for m in model.sensors for k in ("weight", "bias")}
        if adapter:
            reads |= {f"adapter.{i}.{k}" for i in (0, 2) for k in ("weight", "bias")}
        if not reads <= set(trained):
            return None
        return cls(p, tuple(model.sensors), adapter)

    def __call__(self, params: Mapping[str, Tensor], emb: Mapping[str, Tensor], y: Tensor,
                 present: Tensor, weight: Tensor, extras: Mapping[str, Tensor]
                 ) -> tuple[Tensor, dict[str, Tensor], dict[str, Tensor]]:
        p, sensors = self.p, self.sensors
        count = weight.sum(dim=-1)                                  # [k]
        share = (weight / count.unsqueeze(-1)).unsqueeze(-1)       # [k, B, 1]
        # a sensor counts in L_h and L_cs when present in every real row (`batch_presence`)
        presence = torch.where(weight.unsqueeze(-1) > 0, present,
                               torch.ones_like(present)).amin(dim=-2)   # [k, M]

        def mean(rows: Tensor) -> Tensor:
            return (rows * weight).sum(dim=-1) / count

        joined = torch.cat([emb[m] for m in sensors], dim=-1)
        z = _linear(joined, params["fusion.0.weight"], params["fusion.0.bias"]).relu_()
        rows, d_logits = cross_entropy_with_grad(
            _linear(z, params["head.weight"], params["head.bias"]), y)
        loss = mean(rows)
        if self.adapter:   # the personal path, from detached z and head
            hidden = _linear(z, params["adapter.0.weight"], params["adapter.0.bias"]).relu_()
            own = z + _linear(hidden, params["adapter.2.weight"], params["adapter.2.bias"])
            rows, d_personal = cross_entropy_with_grad(
                _linear(own, params["head.weight"], params["head.bias"]), y)
            loss = loss + mean(rows)
        d_emb: dict[str, Tensor] = {}
        d_sensor: dict[str, Tensor] = {}
        if p.lambda_h > 0:
            share_h = p.lambda_h * presence / presence.sum(-1, keepdim=True).clamp(min=1.0)
            per = []
            for j, m in enumerate(sensors):
                rows, grad = cross_entropy_with_grad(
                    _linear(emb[m], params[f"heads.{m}.weight"], params[f"heads.{m}.bias"]), y)
                per.append(mean(rows))
                d_sensor[m] = grad.mul_(share * share_h[:, j, None, None])
            loss = loss + p.lambda_h * (torch.stack(per, -1) * presence).sum(-1) \
                / presence.sum(-1).clamp(min=1.0)
        if p.lambda_cs > 0:
            loss = loss + self._cross_sensor(emb, presence, weight, count, share, d_emb)
        d_z = None
        if p.lambda_p > 0 and "prototypes" in extras:
            term, d_z = self._prototypes(z, y, weight, extras)
            loss = loss + term
        return loss, *self._reverse(params, emb, joined, z, d_logits.mul_(share),
                                    d_personal.mul_(share) if self.adapter else None,
                                    hidden if self.adapter else None, d_z, d_sensor, d_emb)

    def _cross_sensor(self, emb: Mapping[str, Tensor], presence: Tensor, weight: Tensor,
                      count: Tensor, share: Tensor, d_emb: dict[str, Tensor]) -> Tensor:
        """λ_cs L_cs (symmetric InfoNCE of every pair of present sensors); adds its gradient
        to `d_emb`."""
        p, sensors = self.p, self.sensors
        normed = {m: _Normalized(emb[m]) for m in sensors}
        padding = ((1.0 - weight) * PADDING_LOGIT).unsqueeze(-2)        # [k, 1, B]
        total = presence.new_zeros(presence.shape[0])
        pairs = presence.new_zeros(presence.shape[0])
        grads = []
        for a in range(len(sensors)):
            for b in range(a + 1, len(sensors)):
                both = presence[:, a] * presence[:, b]
                na, nb = normed[sensors[a]].value, normed[sensors[b]].value
                omega = torch.bmm(na, nb.transpose(1, 2)) / p.kappa_c        # [k, B, B]
                target = torch.arange(omega.shape[-1], device=omega.device).expand(
                    omega.shape[:-1])
                by_row, d_row = cross_entropy_with_grad(omega + padding, target)
                by_col, d_col = cross_entropy_with_grad(omega.transpose(1, 2) + padding, target)
                pair = 0.5 * ((by_row * weight).sum(-1) / count
                              + (by_col * weight).sum(-1) / count)
                total = total + both * pair
                pairs = pairs + both
                d_omega = d_row.mul_(share) + d_col.mul_(share).transpose(1, 2)
                grads.append((a, b, both, d_omega, na, nb))
        scale = p.lambda_cs / pairs.clamp(min=1.0)
        for a, b, both, d_omega, na, nb in grads:
            d_omega.mul_((0.5 * scale * both / p.kappa_c).view(-1, 1, 1))
            for m, d_n in ((sensors[a], torch.bmm(d_omega, nb)),
                           (sensors[b], torch.bmm(d_omega.transpose(1, 2), na))):
                d = normed[m].backward(d_n)
                d_emb[m] = d if m not in d_emb else d_emb[m] + d
        return p.lambda_cs * (total / pairs.clamp(min=1.0))

    def _prototypes(self, z: Tensor, y: Tensor, weight: Tensor, extras: Mapping[str, Tensor]
                    ) -> tuple[Tensor, Tensor]:
        """λ_p L_p and its gradient with respect to z."""
        p = self.p
        mask = extras["prototype_mask"]
        missing = mask <= 0
        normed = _Normalized(z)
        protos = F.normalize(extras["prototypes"], dim=1)
        # contiguous, as in `prototype_loss`: the same bits whatever the program's size
        logits = (normed.value @ protos.T.contiguous() / p.kappa_p).masked_fill(
            missing, NO_PROTOTYPE_LOGIT)
        rows, grad = cross_entropy_with_grad(logits, y)
        counted = mask[y] * weight
        total = counted.sum(-1).clamp(min=1.0)
        term = p.lambda_p * (rows * counted).sum(-1) / total
        # no gradient reaches a class without a prototype: its softmax is exactly 0 (exp of
        # -1e4 underflows), and a row of such a class counts nowhere
        grad.mul_((p.lambda_p * counted / total.unsqueeze(-1)).unsqueeze(-1))
        return term, normed.backward(grad @ protos / p.kappa_p)

    def _reverse(self, params: Mapping[str, Tensor], emb: Mapping[str, Tensor], joined: Tensor,
                 z: Tensor, d_logits: Tensor, d_personal: Tensor | None,
                 hidden: Tensor | None, d_z_extra: Tensor | None,
                 d_sensor: Mapping[str, Tensor], d_emb: dict[str, Tensor]
                 ) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        """The network's reverse pass: parameter gradients and the embeddings' gradients."""
        grads: dict[str, Tensor] = {
            "head.weight": torch.bmm(d_logits.transpose(1, 2), z),
            "head.bias": d_logits.sum(1)}
        d_z = torch.bmm(d_logits, params["head.weight"])
        if d_z_extra is not None:
            d_z = d_z + d_z_extra
        if d_personal is not None and hidden is not None:   # reaches the adapter only
            d_own = torch.bmm(d_personal, params["head.weight"])
            grads["adapter.2.weight"] = torch.bmm(d_own.transpose(1, 2), hidden)
            grads["adapter.2.bias"] = d_own.sum(1)
            d_hidden = torch.ops.aten.threshold_backward(
                torch.bmm(d_own, params["adapter.2.weight"]), hidden, 0)
            grads["adapter.0.weight"] = torch.bmm(d_hidden.transpose(1, 2), z)
            grads["adapter.0.bias"] = d_hidden.sum(1)
        d_pre = torch.ops.aten.threshold_backward(d_z, z, 0)
        grads["fusion.0.weight"] = torch.bmm(d_pre.transpose(1, 2), joined)
        grads["fusion.0.bias"] = d_pre.sum(1)
        d_joined = torch.bmm(d_pre, params["fusion.0.weight"])
        start = 0
        for m in self.sensors:
            width = emb[m].shape[-1]
            d = d_joined[..., start:start + width]
            start += width
            if m in d_sensor:
                grads[f"heads.{m}.weight"] = torch.bmm(d_sensor[m].transpose(1, 2), emb[m])
                grads[f"heads.{m}.bias"] = d_sensor[m].sum(1)
                d = d + torch.bmm(d_sensor[m], params[f"heads.{m}.weight"])
            d_emb[m] = d if m not in d_emb else d + d_emb[m]
        return grads, d_emb


def _after_encoders(objective: Objective, model: RaymmNet, trained: Sequence[str],
                    use_adapter: bool) -> TideClosedForm | None:
    """`TideClosedForm.build` for the objective's parameters."""
    assert isinstance(objective, TideObjective)   # looked up by the class registered as "tide"
    return TideClosedForm.build(objective.p, model, trained, use_adapter)


register_closed_form("tide", ClosedForm(after_encoders=_after_encoders))
