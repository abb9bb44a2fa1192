"""Harmony's two stages (Ouyang et al., MobiSys 2023) as a schedule.

1. Modality-wise FL, rounds 1..R1: every sensor group `sensor:<m>` (encoder E_m and its own
   head H_m, i.e. the unimodal network of m) is active; every online device may be selected,
   and a selected device trains the unimodal networks of the sensors it holds
   (`training.upload: held`), so θ_m is averaged over the pod of m, unimodal and multimodal
   devices alike (one unimodal FL subsystem per sensor, run side by side).
2. Federated fusion learning, rounds R1+1..R: only devices holding two or more sensors are
   eligible. With a fusion layer (`model.fusion: concat`) they train the `shared` group (fusion
   + task head) on top of the encoders of stage 1, which stay frozen (sent once, counted once;
   `finetune_encoders: true` trains them too); with late fusion (`sum_logits`) the classifier
   *is* the sensor heads, so every sensor group is trained on the fused prediction.

R1 = round(modality_fraction · rounds), at least 1 and at most rounds - 1. The stages are the
schedule's phases (`modality`, `fusion`): sync windows restart at the boundary, and early
stopping counts only evaluations of the fusion stage (`final_stage_start`), as the TIDE paper
does for staged baselines. See docs/methods/harmony.md for what the paper leaves open.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field

from raymm.config.schema import Scenario
from raymm.errors import refuse
from raymm.models.network import SHARED
from raymm.protocol.registry import SCHEDULES
from raymm.protocol.seams import Schedule

MODALITY, FUSION = "modality", "fusion"


class HarmonyParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    #: share of the rounds given to modality-wise FL (stage 1; the authors' released runs
    #: give it about two thirds of the local epochs); the rest is fusion learning
    modality_fraction: float = Field(default=2 / 3, gt=0, lt=1)
    #: in the fusion stage, also train the sensor encoders (with a fusion layer; late fusion
    #: always trains the sensor groups, which hold its classifier heads)
    finetune_encoders: bool = False


def fusion_start(rounds: int, modality_fraction: float) -> int:
    """First round of the fusion stage: R1 + 1 with R1 = round(fraction·rounds) in
    [1, rounds - 1]."""
    r1 = min(max(int(round(modality_fraction * rounds)), 1), rounds - 1)
    return r1 + 1


@SCHEDULES.register("harmony")
class HarmonySchedule(Schedule):
    """Modality-wise FL (every sensor's unimodal network, every device) for the first
    `modality_fraction` of the rounds, then fusion learning among multimodal devices."""

    Params = HarmonyParams

    def __init__(self, params: HarmonyParams) -> None:
        self.params = params
        self.final_stage_start = 2
        self.rounds = 2
        self.fusion_layer = True
        self._sensors: tuple[str, ...] = ()

    @staticmethod
    def model_needs(params: HarmonyParams) -> frozenset[str]:
        return frozenset({"sensor_groups"})

    @staticmethod
    def check_scenario(params: HarmonyParams, scenario: Scenario,
                       sensors: tuple[str, ...] | None) -> list[str]:
        problems = []
        if scenario.rounds < 2:
            problems.append("rounds: harmony needs at least 2 rounds (one per stage)")
        if scenario.model.fusion != "sum_logits" and not scenario.model.aux_heads:
            problems.append("model.aux_heads: harmony's modality-wise stage trains each sensor's "
                            "encoder with its own head; set model.aux_heads: true")
        if scenario.training.upload != "held":
            problems.append("training.upload: harmony trains only the sensors a device holds; "
                            "set training.upload: held")
        return problems

    def bind(self, sc: Scenario, sensors: tuple[str, ...]) -> None:
        refuse(self.check_scenario(self.params, sc, sensors))
        self.rounds = sc.rounds
        self.final_stage_start = fusion_start(sc.rounds, self.params.modality_fraction)
        self.fusion_layer = sc.model.fusion != "sum_logits"   # concat or attention
        self._sensors = tuple(sensors)

    def in_fusion(self, t: int) -> bool:
        return t >= self.final_stage_start

    def active_groups(self, round: int, groups: list[str]) -> tuple[str, ...]:
        sensor_groups = tuple(g for g in groups if g != SHARED)
        if not self.in_fusion(round):
            return sensor_groups
        if self.fusion_layer and not self.params.finetune_encoders:
            return (SHARED,)
        return tuple(groups)

    def frozen_groups(self, round: int) -> tuple[str, ...]:
        """The stage-1 encoders a fusion-stage device trains on top of but does not change:
        each is sent to a device once (the server's `_frozen_bytes`)."""
        if self.in_fusion(round) and self.fusion_layer and not self.params.finetune_encoders:
            return tuple(f"sensor:{m}" for m in self._sensors)
        return ()

    def eligible(self, round: int, sensor_mask: np.ndarray,
                 sensors: tuple[str, ...]) -> np.ndarray:
        if not self.in_fusion(round):
            return np.ones(sensor_mask.shape[0], dtype=bool)
        fused: npt.NDArray[np.bool_] = sensor_mask.sum(axis=1) >= 2
        return fused

    def phase(self, round: int) -> str:
        return FUSION if self.in_fusion(round) else MODALITY

    def phase_span(self, round: int) -> tuple[int, int]:
        if self.in_fusion(round):
            return self.final_stage_start, self.rounds
        return 1, self.final_stage_start - 1
