"""Harmony's server (Ouyang et al., MobiSys 2023): per-group FedAvg over the senders, and
each unimodal device keeps the unimodal network it got from the modality-wise stage.

In the modality-wise stage the per-group weighted mean over the devices that sent a group is
one unimodal FL subsystem per sensor (devices upload only what they hold). In the fusion stage
only multimodal devices train and send; under late fusion they fine-tune the sensor groups,
which would change what a unimodal device predicts with, although in Harmony a unimodal device
never takes part in fusion learning and keeps its stage-1 model. So the server keeps the sensor
groups as they stood at the end of stage 1 and offers them, as one alternative model per group
(`raymm.protocol.messages.ClusterModels`), to every device holding a single sensor: those devices
are evaluated with it. Multimodal devices use the global vectors.

Not modelled (docs/methods/harmony.md): the fusion stage's clustering of devices by modality
bias (one cluster: the fusion part is averaged over all multimodal senders).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from policies.aggregation.fedavg import FedAvg
from policies.schedule.harmony import HarmonyParams, fusion_start
from raymm.config.schema import Scenario
from raymm.errors import refuse
from raymm.models.network import SHARED
from raymm.protocol.messages import ClusterModels, UpdateBatch
from raymm.protocol.registry import AGGREGATORS
from raymm.protocol.seams import AggregationContext


@AGGREGATORS.register("harmony")
class HarmonyAggregation(FedAvg):
    """FedAvg per group over its senders (one unimodal FL subsystem per sensor in stage 1);
    single-sensor devices keep the stage-1 sensor groups from the fusion stage on."""

    combinable = True

    def __init__(self, params: object) -> None:
        super().__init__(params)
        self.fusion_start = 2
        self.unimodal = np.zeros(0, bool)
        self.latest: dict[str, np.ndarray] = {}          # sensor groups after the last merge
        self.snapshot: dict[str, np.ndarray] | None = None  # ... at the end of stage 1
        self.round = 0                                    # the round being planned

    @staticmethod
    def check_scenario(params: object, scenario: Scenario,
                       sensors: tuple[str, ...] | None) -> list[str]:
        if scenario.schedule.name != "harmony":
            return ["aggregation.name: harmony keeps the modality-wise stage's models; set "
                    f"schedule: {{name: harmony}} (got {scenario.schedule.name!r})"]
        return []

    def bind(self, sc: Scenario, sensors: tuple[str, ...]) -> None:
        refuse(self.check_scenario(self.params, sc, sensors))
        params = HarmonyParams(**sc.schedule.params())
        self.fusion_start = fusion_start(sc.rounds, params.modality_fraction)

    def aggregate(self, params: dict[str, np.ndarray], batch: UpdateBatch,
                  ctx: AggregationContext) -> dict[str, np.ndarray]:
        if not self.unimodal.size:
            self.unimodal = ctx.obs.sensor_mask.sum(axis=1) == 1
        out = super().aggregate(params, batch, ctx)
        if ctx.round < self.fusion_start:
            self.latest = {g: v.copy() for g, v in out.items() if g != SHARED}
        return out

    def cluster_models(self) -> ClusterModels | None:
        """From the fusion stage on: the stage-1 sensor groups for single-sensor devices.

        The server builds a round's broadcast (this call) right after asking for the round's
        `extras`, which is where the round is learnt; the first call of the fusion stage,
        before any fusion-stage merge, freezes the snapshot."""
        if self.snapshot is None:
            if not self.latest or self.round < self.fusion_start:
                return None
            self.snapshot = self.latest
        n = self.unimodal.shape[0]
        return ClusterModels({g: v[None] for g, v in self.snapshot.items()},
                             {g: np.zeros(n, np.int64) for g in self.snapshot},
                             {g: self.unimodal.copy() for g in self.snapshot})

    def extras(self, round: int) -> dict[str, np.ndarray]:
        self.round = round
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {"unimodal": self.unimodal.copy(), "round": self.round,
                "latest": {g: v.copy() for g, v in self.latest.items()},
                "snapshot": None if self.snapshot is None else
                {g: v.copy() for g, v in self.snapshot.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.unimodal = np.asarray(state["unimodal"], bool).copy()
        self.round = int(state["round"])
        self.latest = {g: np.asarray(v, np.float32).copy() for g, v in state["latest"].items()}
        snap = state["snapshot"]
        self.snapshot = None if snap is None else \
            {g: np.asarray(v, np.float32).copy() for g, v in snap.items()}


@AGGREGATORS.register("harmony_delta")
class HarmonyDelta(HarmonyAggregation):
    """Harmony with periodic sync (training.exchange: delta): the weighted mean uploaded delta
    is added to the global vector, as `delta_mean` does."""

    takes_deltas = True

    def merge(self, current: np.ndarray, mean: np.ndarray) -> np.ndarray:
        merged: npt.NDArray[np.float32] = (current + mean).astype(np.float32)
        return merged
