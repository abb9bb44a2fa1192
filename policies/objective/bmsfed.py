"""BMSFed's device side (Fan et al., ECCV 2024, arXiv 2401.00403): the modal-enhancement loss.

Each of the two sensors a, b (the dataset's order) has global class prototypes P^m_c in its
embedding space (`out.embeddings[m]`, before fusion), broadcast by aggregation `bmsfed`. A
sample's prototype logits are its negative Euclidean distances (not squared) to them,
s^m_{b,c} = -||e_m(x_b) - P^m_c||, and L^m = mean_b CE(s^m_b, y_b). With both sensors present,
the batch ratio ρ = Σ_b softmax(s^a_b)[y_b] / Σ_b softmax(s^b_b)[y_b] says which one dominates
and the weak one is pulled toward its prototypes:

    L = CE(logits, y) + α·L^b  if ρ > 1,   + α·L^a  if ρ < 1,   nothing more if ρ = 1;

a device training with one sensor (it holds one, or the server told it to train one,
`Selector.train_sensors`) adds α·L^m of that sensor. Classes without a global prototype yet
are left out of the prototype softmax, and their samples add nothing to L^m or ρ.

After training the device reports, per trained sensor, its class means and counts of the
embeddings with the trained model over its training samples (the server's prototypes), and how
many of those samples the nearest of its own class means classifies right (the server's
imbalance ratio b_i = acc^a_i / acc^b_i).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field
from torch import Tensor

from raymm.config.schema import Scenario
from raymm.errors import refuse
from raymm.models import RaymmNet
from raymm.protocol.losses import mean_cross_entropy
from raymm.protocol.registry import OBJECTIVES
from raymm.protocol.seams import LossInputs, Objective

#: broadcast: [M, C, E] global prototypes and [M, C] 1 where a class has one
PROTO, PROTO_OK = "bmsfed/proto", "bmsfed/proto_ok"
#: uplink: [M, C, E] local class means, [M, C] class counts, [M] nearest-mean correct (-1: not
#: trained with that sensor)
MEANS, COUNTS, CORRECT = "bmsfed/means", "bmsfed/counts", "bmsfed/correct"

#: prototype logit of a class without a prototype: out of the softmax
NO_CLASS = -1e9


class BMSFedParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    #: α, the weight of the prototype loss (the authors' `MI_alpha`, 2.0 in their scripts)
    alpha: float = Field(default=2.0, ge=0)


def prototype_logits(emb: Tensor, protos: Tensor, ok: Tensor) -> Tensor:
    """s_{b,c} = -||emb_b - protos_c||₂: [B, E], [C, E], [C] -> [B, C]; classes without a
    prototype (ok 0) get `NO_CLASS`."""
    dist = torch.linalg.vector_norm(emb[:, None, :] - protos[None, :, :], dim=-1)
    return torch.where(ok[None, :] > 0, -dist, torch.full_like(dist, NO_CLASS))


def enhancement_terms(logits: Tensor, y: Tensor, ok: Tensor, weight: Tensor
                      ) -> tuple[Tensor, Tensor]:
    """(L^m = Σ_b w_b g_b CE(s_b, y_b) / Σ_b w_b, S^m = Σ_b w_b g_b softmax(s_b)[y_b]) with
    g_b = 1 when y_b's class has a prototype."""
    gate = ok[y] * weight
    ce = F.cross_entropy(logits, y, reduction="none")
    p_true = torch.softmax(logits, dim=1).gather(1, y[:, None])[:, 0]
    return (ce * gate).sum() / weight.sum(), (p_true * gate).sum()


def enhancement_loss(emb: dict[str, Tensor], y: Tensor, present: Tensor, protos: Tensor,
                     ok: Tensor, alpha: float, weight: Tensor | None = None) -> Tensor:
    """α times the prototype loss of the weak sensor (both present) or of the one present.

    `emb` holds the two sensors' embeddings in the dataset's order, `present` [B, 2] which of
    them the device trains with (the same for every real row), `protos` [2, C, E], `ok` [2, C].
    No Python branch on values: the ρ > 1 / ρ < 1 choice is a `torch.where`."""
    w = torch.ones_like(y, dtype=protos.dtype) if weight is None else weight
    (a, b) = tuple(emb.values())
    loss_a, score_a = enhancement_terms(prototype_logits(a, protos[0], ok[0]), y, ok[0], w)
    loss_b, score_b = enhancement_terms(prototype_logits(b, protos[1], ok[1]), y, ok[1], w)
    has = ((present * w[:, None]).sum(dim=0) > 0).to(protos.dtype)   # [2]: device holds m
    both = has[0] * has[1]
    zero = torch.zeros_like(score_a)
    # ρ = S^a / S^b > 1 ⇔ S^a > S^b (both sums are non-negative)
    coef_a = both * torch.where(score_a < score_b, zero + 1, zero) + (1 - both) * has[0]
    coef_b = both * torch.where(score_a > score_b, zero + 1, zero) + (1 - both) * has[1]
    return alpha * (coef_a * loss_a + coef_b * loss_b)


def class_means(emb: Tensor, y: Tensor, classes: int) -> tuple[Tensor, Tensor]:
    """(per-class mean [C, E], class counts [C]); zero rows for absent classes."""
    onehot = F.one_hot(y, classes).to(emb.dtype)
    counts = onehot.sum(dim=0)
    return onehot.T @ emb / counts.clamp(min=1.0)[:, None], counts


def nearest_mean_correct(emb: Tensor, y: Tensor, means: Tensor, counts: Tensor) -> int:
    """How many samples the nearest class mean (Euclidean, classes with samples only)
    classifies right."""
    dist = torch.cdist(emb, means)
    dist = torch.where(counts[None, :] > 0, dist, torch.full_like(dist, float("inf")))
    return int((dist.argmin(dim=1) == y).sum())


@OBJECTIVES.register("bmsfed")
class BMSFedObjective(Objective):
    """Cross-entropy plus α times the modal-enhancement (prototype) loss of the weak sensor;
    reports class means and nearest-mean accuracies per trained sensor."""

    Params = BMSFedParams
    vectorisable = True
    mixes_sensor_sets = True

    def __init__(self, params: BMSFedParams) -> None:
        self.params = params
        self.alpha = params.alpha

    @staticmethod
    def model_needs(params: BMSFedParams) -> frozenset[str]:
        return frozenset({"sensor_groups"})

    @staticmethod
    def check_scenario(params: BMSFedParams, scenario: Scenario,
                       sensors: tuple[str, ...] | None) -> list[str]:
        problems = []
        if scenario.aggregation.name not in ("bmsfed", "bmsfed_delta"):
            problems.append("objective.name: bmsfed reads the prototypes that aggregation "
                            f"bmsfed broadcasts (got aggregation {scenario.aggregation.name!r})")
        if sensors is not None and len(sensors) != 2:
            problems.append(f"objective.name: bmsfed balances two modalities; the dataset has "
                            f"{len(sensors)} sensors")
        return problems

    def bind(self, scenario: Scenario, sensors: tuple[str, ...]) -> None:
        """Under logit fusion (`sum_logits`) a sensor a device does not train adds exactly
        nothing to its logits or to this loss, so a lock-step program per sensor set gives the
        same bits as one mixed program, and runs faster: a mixed one selects the rows of every
        encoder's input at every step. Under a fusion layer the absent sensor's zero-input
        embedding enters the fused vector: programs stay mixed (one constant embedding)."""
        refuse(self.check_scenario(self.params, scenario, sensors))
        self.mixes_sensor_sets = scenario.model.fusion != "sum_logits"

    def loss(self, inp: LossInputs) -> Tensor:
        loss = mean_cross_entropy(inp.out.logits, inp.y, inp.weight)
        if PROTO not in inp.extras or self.alpha <= 0:  # no prototypes before the first round
            return loss
        emb = {m: inp.out.embeddings[m] for m in inp.out.embeddings}
        return loss + enhancement_loss(emb, inp.y, inp.present, inp.extras[PROTO],
                                       inp.extras[PROTO_OK], self.alpha, inp.weight)

    @torch.no_grad()
    def device_extras(self, model: RaymmNet, xs: dict[str, Tensor], y: Tensor, held_t: Tensor,
                      use_adapter: bool) -> dict[str, np.ndarray]:
        """Class means and counts of every trained sensor's embedding with the trained model,
        and the nearest-mean correct count (-1 for a sensor it did not train with)."""
        out = model(xs, held_t.expand(y.shape[0], -1))
        classes = int(out.logits.shape[1])
        means, counts, correct = [], [], []
        for j, m in enumerate(model.sensors):
            emb = out.embeddings[m]
            mu, n = class_means(emb, y, classes)
            trained = bool(held_t[j] > 0)
            means.append(mu if trained else torch.zeros_like(mu))
            counts.append(n if trained else torch.zeros_like(n))
            correct.append(nearest_mean_correct(emb, y, mu, n) if trained else -1)
        return {MEANS: torch.stack(means).cpu().numpy().astype(np.float32),
                COUNTS: torch.stack(counts).cpu().numpy().astype(np.int32),
                CORRECT: np.asarray(correct, np.int32)}
