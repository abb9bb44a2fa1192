"""FedMChain's stage objective (MCFT): the active modality's task loss plus alignment and
complementarity toward the preceding modalities of the chain that the device holds.

    L = mean_b CE(z_b^(m), y_b) + 1[|P_m ∩ M_i| > 0]·(λ_a·R_a + λ_c·mean_b e_b·CE(z_b^(m), y_b))

R_a: InfoNCE of the ℓ2-normalised features h̃^(m) (anchors) against h̃^(m') of the same batch
(candidates; positives on the diagonal; cosine / τ), averaged over m' ∈ P_m ∩ M_i.
e_b = 1 - softmax(Σ_{m'} z_b^(m'))[y_b]. Everything from frozen modalities is computed without
gradient. The active modality is the one `sensor:<m>` group being trained; the chain is read
from the scenario's `schedule` section, so this objective needs `schedule: modality_chain`.
With `order: adaptive` the phase's P_m arrives with the broadcast instead, and in the order's
probe (several sensor groups trained at once, no predecessors) the loss is Σ_m mean_b
CE(z_b^(m), y_b): every branch learns alone, as if it were trained in a phase of its own.

Every mean over samples honours `LossInputs.weight` (padding rows of a short last batch count
nowhere and are no InfoNCE candidates), and the only Python branches are on the held sensors
and the trained groups, which a lock-step bucket shares: `raymm.training.lockstep` trains MCFT
devices in lock-step. With `weight=None` (the sequential path) each term is what it was before.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field
from torch import Tensor

from policies.schedule.chain import PRECEDING, preceding, resolve_chain
from raymm.config.schema import Scenario
from raymm.errors import refuse
from raymm.protocol.losses import contrastive_ce, sample_mean
from raymm.protocol.registry import OBJECTIVES
from raymm.protocol.seams import LossInputs, Objective


def info_nce(anchor: Tensor, candidates: Tensor, tau: float, weight: Tensor | None = None
             ) -> Tensor:
    """mean_b -log softmax_b'(cos(a_b, c_b') / τ)[b]; inputs [B, E], not yet normalised.
    With `weight`, padding rows are neither candidates nor anchors."""
    a, c = F.normalize(anchor, dim=1), F.normalize(candidates, dim=1)
    return contrastive_ce(a @ c.T / tau, weight)


def complementarity_weights(prev_logits: Tensor, y: Tensor) -> Tensor:
    """e_b = 1 - softmax(Σ preceding logits)[y_b], without gradient."""
    p = torch.softmax(prev_logits.detach(), dim=1)
    return 1.0 - p.gather(1, y[:, None]).squeeze(1)


class MCFTParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    lambda_a: float = Field(default=0.4, ge=0)
    lambda_c: float = Field(default=1.0, ge=0)
    #: InfoNCE temperature (the paper gives none)
    tau: float = Field(default=0.1, gt=0)


@OBJECTIVES.register("mcft")
class MCFTStage(Objective):
    Params = MCFTParams
    uses_adapter = False
    #: honours `inp.weight`, branches only on what a bucket shares (see raymm.training.lockstep)
    vectorisable = True

    def __init__(self, params: MCFTParams) -> None:
        self.p = params
        self.chain: tuple[str, ...] = ()
        self.sensors: tuple[str, ...] = ()

    @staticmethod
    def model_needs(params: MCFTParams) -> frozenset[str]:
        return frozenset({"sensor_groups", "sensor_heads"})

    @staticmethod
    def check_scenario(params: MCFTParams, scenario: Scenario,
                       sensors: tuple[str, ...] | None) -> list[str]:
        if scenario.schedule.name != "modality_chain":
            return [f"objective.name: mcft needs schedule modality_chain, got "
                    f"{scenario.schedule.name!r}"]
        return []

    def bind(self, sc: Scenario, sensors: tuple[str, ...]) -> None:
        refuse(self.check_scenario(self.p, sc, sensors))
        self.chain = resolve_chain(sc.schedule.params().get("chain"), sensors)
        self.sensors = tuple(sensors)

    def sensors_read(self, groups: tuple[str, ...], held: tuple[str, ...],
                     extras: Mapping[str, Tensor]) -> frozenset[str] | None:
        """The active branch and the held preceding ones (`loss` reads nothing else): in a
        chain's first phase no other modality's encoder needs to run."""
        active = [g.partition(":")[2] for g in groups if g.startswith("sensor:")]
        if not active or len(active) != len(groups):
            return None   # `loss` refuses these
        if len(active) > 1:   # the adaptive order's probe: each branch alone
            return frozenset(active)
        if PRECEDING in extras:   # the phase's P_m is a tensor: any held modality
            return None
        m = active[0]
        return frozenset([m, *(p for p in preceding(self.chain, m) if p in held)])

    def loss(self, inp: LossInputs) -> Tensor:
        active = [g.partition(":")[2] for g in inp.groups if g.startswith("sensor:")]
        if not active or len(active) != len(inp.groups):
            raise ValueError(f"mcft trains modality branches only, got groups {inp.groups}")
        out, w = inp.out, inp.weight
        if len(active) > 1:  # the adaptive order's probe: each branch alone, no predecessors
            return sum((sample_mean(F.cross_entropy(out.sensor_logits[m], inp.y,
                                                    reduction="none"), w) for m in active),
                       torch.zeros((), device=inp.y.device))
        m = active[0]
        ce = F.cross_entropy(out.sensor_logits[m], inp.y, reduction="none")
        mask = inp.extras.get(PRECEDING)
        if mask is not None:
            return self._broadcast_stage_loss(m, ce, inp, mask)
        # P_m ∩ M_i is fixed per device, so this branch is not data dependent
        prev = [p for p in preceding(self.chain, m) if p in inp.held]
        if not prev:
            return sample_mean(ce, w)
        r_a = torch.stack([info_nce(out.embeddings[m], out.embeddings[p].detach(), self.p.tau,
                                    w) for p in prev]).mean()
        prev_logits = [out.sensor_logits[p] for p in prev]
        e = complementarity_weights(sum(prev_logits[1:], prev_logits[0]), inp.y)
        return (sample_mean(ce, w) + self.p.lambda_a * r_a
                + self.p.lambda_c * sample_mean(e * ce, w))

    def _broadcast_stage_loss(self, m: str, ce: Tensor, inp: LossInputs, mask: Tensor
                              ) -> Tensor:
        """The same loss with P_m given as a float mask over the sensors (adaptive order).
        The mask is a tensor, so it weighs the terms of every other held modality instead of
        choosing them in Python: a lock-step trainer cannot read tensor values."""
        out, w = inp.out, inp.weight
        others = [(j, p) for j, p in enumerate(self.sensors) if p in inp.held and p != m]
        if not others:
            return sample_mean(ce, w)
        on = [mask[j] for j, _ in others]
        count = sum(on[1:], on[0])
        r_a = sum(o * info_nce(out.embeddings[m], out.embeddings[p].detach(), self.p.tau, w)
                  for o, (_, p) in zip(on, others)) / torch.clamp(count, min=1.0)
        weighed = [o * out.sensor_logits[p] for o, (_, p) in zip(on, others)]
        e = complementarity_weights(sum(weighed[1:], weighed[0]), inp.y)
        gate = (count > 0).to(ce.dtype)   # 1[|P_m ∩ M_i| > 0]
        return sample_mean(ce, w) + gate * (self.p.lambda_a * r_a
                                            + self.p.lambda_c * sample_mean(e * ce, w))
