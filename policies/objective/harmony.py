"""Harmony's local loss (Ouyang et al., MobiSys 2023), one per stage of `schedule: harmony`.

- Modality-wise stage: Σ_{m held} CE(H_m(E_m(x_m)), y), each sensor's unimodal network on its
  own input. The terms share no parameter, and the optimizer is per coordinate (SGD or Adam),
  so a multimodal device trains each unimodal network exactly as if it ran one unimodal
  training per sensor, as the authors' devices do.
- Fusion stage: CE of the multimodal prediction (the fusion head, or the summed sensor heads
  under late fusion) with every held sensor present.

The stage boundary is the schedule's (`policies.schedule.harmony.fusion_start`), read from the
scenario's `schedule` section, so this objective needs `schedule: harmony`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from policies.schedule.harmony import HarmonyParams, fusion_start
from raymm.config.schema import Scenario
from raymm.errors import refuse
from raymm.protocol.losses import mean_cross_entropy
from raymm.protocol.registry import OBJECTIVES
from raymm.protocol.seams import LossInputs, Objective


@OBJECTIVES.register("harmony")
class HarmonyObjective(Objective):
    """Σ over held sensors of each unimodal network's cross-entropy in the modality-wise
    stage; cross-entropy of the fused prediction in the fusion stage."""

    uses_adapter = False

    def __init__(self, params: object) -> None:
        self.params = params
        self.fusion_start = 2

    @staticmethod
    def check_scenario(params: object, scenario: Scenario,
                       sensors: tuple[str, ...] | None) -> list[str]:
        if scenario.schedule.name != "harmony":
            return ["objective.name: harmony's loss follows harmony's stages; set schedule: "
                    f"{{name: harmony}} (got {scenario.schedule.name!r})"]
        return []

    def bind(self, sc: Scenario, sensors: tuple[str, ...]) -> None:
        refuse(self.check_scenario(self.params, sc, sensors))
        params = HarmonyParams(**sc.schedule.params())
        self.fusion_start = fusion_start(sc.rounds, params.modality_fraction)

    def loss(self, inp: LossInputs) -> Tensor:
        if inp.round >= self.fusion_start:
            return mean_cross_entropy(inp.out.logits, inp.y, inp.weight)
        terms = [mean_cross_entropy(inp.out.sensor_logits[m], inp.y, inp.weight)
                 for m in inp.held]
        return torch.stack(terms).sum()
