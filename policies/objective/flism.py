"""FLISM's local loss (Orzikulova, Kwak, Shin, Lee, arXiv 2405.11828; docs/methods/flism.md).

L = CE(f(x), y) + L_SupCon(x, x̃) + λ_kd·T²·KL(softmax(f_T(x)/T) ‖ softmax(f(x)/T)):
- x̃, the second view, is x with a random non-empty proper subset of the device's sensors
  dropped and Gaussian noise added; `augment` appends it to the minibatch, so one forward
  pass gives both views (`out` holds 2B rows, `y` the minibatch's B). A device with one
  sensor has no second view and no contrastive term.
- L_SupCon is the supervised contrastive loss (Khosla et al.) over the 2B normalised
  representations: positives of an anchor are the other rows of its class, its own second
  view among them.
- f_T is the teacher, the unweighted mean of the last round's uploads that aggregation
  `flism` broadcasts; the module runs with its parameters through `LossInputs.forward`.
  Before any teacher is broadcast, the model the device received stands in (FLISM starts its
  teacher as a copy of the initial model).
After training the device reports the mean predictive entropy of its trained model on its
training data, which the server's weights read.

Not `vectorisable`: the rows of `out` depend on the device's sensors, and the teacher's
forward pass runs inside the loss; devices train on the sequential path.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field
from torch import Tensor

from raymm.config.schema import Scenario
from raymm.models import GroupLayout
from raymm.models.network import ModelOutput, RaymmNet
from raymm.protocol.registry import OBJECTIVES
from raymm.protocol.seams import LossInputs, Objective

#: extras prefix of the teacher's vector of each group (`flism_teacher/<group>`)
TEACHER = "flism_teacher/"
#: uplink extra: float32 [1], the device's mean predictive entropy after training
ENTROPY = "flism_entropy"
#: the aggregators that send the teacher and read the entropy
AGGREGATORS_OF_FLISM = ("flism", "flism_delta")
#: a logit that takes an anchor's own row out of its softmax (finite: no NaN in gradients)
_SELF_LOGIT = -1e9


class FlismParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    #: λ_kd, weight of the distillation term (FLISM's `kd_coef`, default 1)
    kd_weight: float = Field(default=1.0, ge=0)
    #: T, the distillation temperature (the released code fixes it at 1)
    kd_temperature: float = Field(default=1.0, gt=0)
    #: τ of the supervised contrastive loss (FLISM: 0.1)
    supcon_temperature: float = Field(default=0.1, gt=0)
    #: the contrastive loss is scaled by τ / τ_base (the SupCon reference loss's
    #: `base_temperature`, left at 0.07 by FLISM)
    supcon_base_temperature: float = Field(default=0.07, gt=0)
    #: standard deviation of the Gaussian noise added to the second view (FLISM: 0.7)
    noise_std: float = Field(default=0.7, ge=0)


def supcon_loss(features: Tensor, labels: Tensor, temperature: float,
                base_temperature: float) -> Tensor:
    """Supervised contrastive loss of features [N, F] (every view's rows) with labels [N]:
    -(τ/τ_base)·mean_i mean_{p ∈ P(i)} log softmax_{a ≠ i}(f_i·f_a / τ)[p], f normalised,
    P(i) the other rows of i's class."""
    f = F.normalize(features, dim=1)
    n = f.shape[0]
    own = torch.eye(n, dtype=torch.bool, device=f.device)
    sim = (f @ f.T / temperature).masked_fill(own, _SELF_LOGIT)
    log_prob = sim - torch.logsumexp(sim, dim=1, keepdim=True)
    positive = (labels[:, None] == labels[None, :]) & ~own
    per_anchor = log_prob.masked_fill(~positive, 0.0).sum(dim=1) / positive.sum(dim=1)
    return -(temperature / base_temperature) * per_anchor.mean()


def kd_loss(student: Tensor, teacher: Tensor, temperature: float) -> Tensor:
    """T²·KL(softmax(teacher/T) ‖ softmax(student/T)), summed over classes, averaged over
    rows (torch's KLDivLoss with `batchmean`); no gradient reaches the teacher."""
    log_s = F.log_softmax(student / temperature, dim=1)
    log_t = F.log_softmax(teacher.detach() / temperature, dim=1)
    kl = (log_t.exp() * (log_t - log_s)).sum(dim=1).mean()
    return kl * temperature ** 2


def mean_entropy(logits: Tensor) -> float:
    """Mean over rows of the predictive entropy -Σ_c p_c log p_c of softmax(logits)."""
    log_p = F.log_softmax(logits, dim=1)
    return float(-(log_p.exp() * log_p).sum(dim=1).mean())


def representation(out: ModelOutput, present: Tensor) -> Tensor:
    """The vector the contrastive loss compares: the fused representation z, or, under logit
    fusion (no z), the embeddings of the present sensors side by side (absent ones zero)."""
    if out.z is not None:
        return out.z
    return torch.cat([e * present[:, j:j + 1] for j, e in enumerate(out.embeddings.values())],
                     dim=1)


def second_view(xb: dict[str, Tensor], present: Tensor, held: tuple[str, ...],
                sensors: tuple[str, ...], gen: torch.Generator, noise_std: float
                ) -> tuple[dict[str, Tensor], Tensor]:
    """x̃: a uniformly drawn number k ∈ [1, |held| - 1] of held sensors, chosen at random,
    zeroed and marked absent, then Gaussian noise of `noise_std` added to every sensor's
    input (as the released code adds it to the whole input). Draws from `gen` in a fixed
    order: k, the sensors, then the noise sensor by sensor."""
    n = len(held)
    k = 1 + int(torch.randint(n - 1, (), generator=gen))
    dropped = {held[i] for i in torch.randperm(n, generator=gen)[:k].tolist()}
    keep = torch.ones(present.shape[1], dtype=present.dtype)
    for m in dropped:
        keep[sensors.index(m)] = 0.0
    out = {}
    for m, x in xb.items():
        noise = torch.randn(x.shape, generator=gen).to(x) * noise_std
        out[m] = noise if m in dropped else x + noise
    return out, present * keep.to(present.device)


@OBJECTIVES.register("flism")
class Flism(Objective):
    """CE + supervised contrastive loss between x and a sensor-dropped noisy view + KD from
    the broadcast teacher; reports the trained model's mean predictive entropy."""

    Params = FlismParams
    # not `vectorisable`: see the module docstring

    def __init__(self, params: FlismParams) -> None:
        self.p = params

    @staticmethod
    def check_scenario(params: BaseModel, scenario: Scenario, sensors: tuple[str, ...] | None
                       ) -> list[str]:
        if scenario.aggregation.name not in AGGREGATORS_OF_FLISM:
            return ["objective.name: flism reads the teacher that aggregation flism (or "
                    "flism_delta) broadcasts and reports the entropy it weights by (got "
                    f"aggregation {scenario.aggregation.name!r})"]
        return []

    def augment(self, xb: dict[str, Tensor], present: Tensor, held: tuple[str, ...],
                sensors: tuple[str, ...], gen: torch.Generator
                ) -> tuple[dict[str, Tensor], Tensor]:
        """A device with two or more sensors: the minibatch followed by its second view
        (2B rows). Inputs are not mutated."""
        if len(held) < 2:
            return xb, present
        x2, present2 = second_view(xb, present, held, sensors, gen, self.p.noise_std)
        return ({m: torch.cat([x, x2[m]]) for m, x in xb.items()},
                torch.cat([present, present2]))

    def device_tensors(self, state: dict[str, np.ndarray], extras: dict[str, np.ndarray],
                       layout: GroupLayout, groups: list[str]) -> dict[str, Tensor]:
        """The teacher's parameters by name (`flism_teacher/<name>`), from its broadcast
        vectors: views of one tensor per group."""
        out = {}
        for key, vec in extras.items():
            if not key.startswith(TEACHER):
                continue
            flat = torch.from_numpy(np.asarray(vec, np.float32))
            for s in layout.slots[key[len(TEACHER):]]:
                if not s.buffer:
                    out[TEACHER + s.name] = flat[s.start:s.stop].view(s.shape)
        return out

    def loss(self, inp: LossInputs) -> Tensor:
        b = inp.y.shape[0]
        logits = inp.out.logits
        loss = F.cross_entropy(logits[:b], inp.y)
        if logits.shape[0] > b:   # `augment` appended the second view
            labels = torch.cat([inp.y, inp.y])
            loss = loss + supcon_loss(representation(inp.out, inp.present), labels,
                                      self.p.supcon_temperature,
                                      self.p.supcon_base_temperature)
        if self.p.kd_weight > 0:
            loss = loss + self.p.kd_weight * kd_loss(
                logits[:b], self._teacher_logits(inp, b), self.p.kd_temperature)
        return loss

    def _teacher_logits(self, inp: LossInputs, b: int) -> Tensor:
        """The teacher's logits on the minibatch's first view: the broadcast teacher, else the
        model the device started the round from."""
        assert inp.forward is not None, "objective flism needs LossInputs.forward"
        where = inp.out.logits.device
        teacher = {name[len(TEACHER):]: t.to(where) for name, t in inp.local.items()
                   if name.startswith(TEACHER)} or dict(inp.anchor)
        with torch.no_grad():
            x = {m: v[:b] for m, v in inp.x.items()}
            return inp.forward(teacher, x, inp.present[:b]).logits

    @torch.no_grad()
    def device_extras(self, model: RaymmNet, xs: dict[str, Tensor], y: Tensor,
                      held_t: Tensor, use_adapter: bool) -> dict[str, np.ndarray]:
        """H_i: the trained model's mean predictive entropy on the device's training data
        (evaluation mode, as the released code computes it)."""
        was = model.training
        model.eval()
        try:
            logits = model(xs, held_t.expand(y.shape[0], -1), use_adapter=use_adapter).logits
        finally:
            model.train(was)
        return {ENTROPY: np.array([mean_entropy(logits)], np.float32)}
