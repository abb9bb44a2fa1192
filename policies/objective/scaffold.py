"""SCAFFOLD's device side: cross-entropy with the control-variate correction.

Each step follows g + c - c_i, written functionally as the loss term Σ θ·(c - c_i) (its
gradient is c - c_i). The device keeps c_i (state `scaffold_ci/<g>`) and uploads
Δc_i = c_i⁺ - c_i as a per-device extra (`scaffold_dc/<g>`, counted as uplink); the server's c
arrives as the extra `scaffold_c/<g>` (absent = 0).

`variate` picks the update of c_i:
- "displacement": option II of the paper, c_i⁺ = c_i - c + (θ_start - θ_end)/(steps·lr);
- "gradients" (default): c_i⁺ = the mean raw minibatch gradient along the local steps. With
  plain SGD this is exactly option II (θ_start - θ_end = lr·Σ(g_k + c - c_i)); with Adam the
  displacement is no longer lr·gradient (Adam steps are ~lr per coordinate whatever the
  gradient), so option II's c_i is mis-scaled and swamps the task gradient, while this stays
  a gradient estimate.

With periodic sync (training.exchange: delta, aggregation: scaffold_delta) c_i is still updated
every round a device trains, but Δc_i reaches the server only at syncs: the device keeps the
c_i it last reported (`scaffold_ci_sent/<g>`, absent when equal to c_i) and sends the whole
change since then, so the server's c = Σ reported changes / N stays exact.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict
from torch import Tensor

from raymm.models.layout import GroupLayout
from raymm.protocol.registry import OBJECTIVES
from raymm.protocol.seams import DeviceFinish, LossInputs, Objective

C, CI, DC = "scaffold_c/", "scaffold_ci/", "scaffold_dc/"
CI_SENT = "scaffold_ci_sent/"


def _vec(src: dict[str, np.ndarray], key: str, size: int) -> np.ndarray:
    v = src.get(key)
    return np.zeros(size, np.float32) if v is None else np.asarray(v, np.float32)


class ScaffoldParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    variate: Literal["gradients", "displacement"] = "gradients"


@OBJECTIVES.register("scaffold")
class ScaffoldObjective(Objective):
    Params = ScaffoldParams
    uses_adapter = False

    def __init__(self, params: ScaffoldParams | None = None) -> None:
        self.variate = (params or ScaffoldParams()).variate
        self.needs_grad_mean = self.variate == "gradients"

    def device_tensors(self, state: dict[str, np.ndarray], extras: dict[str, np.ndarray],
                       layout: GroupLayout, groups: list[str]) -> dict[str, Tensor]:
        """c - c_i per parameter name (views of one flat vector per group)."""
        out = {}
        for g in groups:
            size = layout.sizes[g]
            corr = torch.from_numpy(_vec(extras, C + g, size) - _vec(state, CI + g, size))
            for s in layout.slots[g]:
                out[s.name] = corr[s.start:s.stop].view(s.shape)
        return out

    def loss(self, inp: LossInputs) -> Tensor:
        loss = F.cross_entropy(inp.out.logits, inp.y)
        for name, p in inp.trainable.items():
            if name in inp.local:
                loss = loss + (p * inp.local[name]).sum()
        return loss

    def device_finish(self, fin: DeviceFinish) -> tuple[dict[str, np.ndarray],
                                                        dict[str, np.ndarray]]:
        state, sent = {}, {}
        for g in fin.groups:
            size = fin.start[g].shape[0]
            ci = _vec(fin.state, CI + g, size)
            c = _vec(fin.extras, C + g, size)
            if fin.steps == 0:
                new = ci
            elif self.variate == "gradients":  # the correction's gradient is c - c_i
                new = (fin.grad_mean[g].astype(np.float64) - (c - ci)).astype(np.float32)
            else:
                drift = (fin.start[g].astype(np.float64) - fin.end[g]) / (fin.steps * fin.lr)
                new = (ci - c + drift).astype(np.float32)
            state[CI + g] = new
            reported = fin.state.get(CI_SENT + g, ci)
            sent[DC + g] = (new - reported).astype(np.float32)
            if not fin.upload:  # dropped this round: the server still knows `reported`
                state[CI_SENT + g] = np.asarray(reported, np.float32)
            elif CI_SENT + g in fin.state:  # reported now (device state merges key by key)
                state[CI_SENT + g] = new
        return state, sent
