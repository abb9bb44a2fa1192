"""FedProto's server side (Tan et al., AAAI 2022): global class prototypes, no model.

Devices keep their whole model (`training.exchange: personal`) and upload only their local
prototypes (`proto_means/<s>`, `proto_counts/<s>` per prototype space, see
policies.objective.fedproto). Per space and class, the global prototype is the plain mean of
the local prototypes of the devices that reported the class this round, each device counting
once whatever its sample count (the authors' `proto_aggregation`; the paper's formula weights
by samples). A class nobody reported this round keeps its previous prototype (with partial
participation the authors' code would drop it). Prototypes are broadcast as `proto/<s>` [C, F]
with `proto_mask/<s>` [C] (1 = the class has one) and count as downlink; uplink counts, per
device, only the classes it holds: F floats plus one count each.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from policies.objective.fedproto import COUNTS, MASK, MEANS, PROTO
from raymm.config.schema import Scenario
from raymm.protocol.messages import UpdateBatch
from raymm.protocol.registry import AGGREGATORS
from raymm.protocol.seams import AggregationContext, Aggregator
from raymm.units import FLOAT_BYTES


def average_prototypes(means: np.ndarray, counts: np.ndarray, protos: np.ndarray | None,
                       has: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """New (prototypes float32 [C, F], has-prototype bool [C]) from n devices' local
    prototypes `means` [n, C, F] and `counts` [n, C]: the unweighted mean over the devices
    with count > 0; classes nobody reported keep `protos` (inputs are not mutated)."""
    reported = (counts > 0).astype(np.float64)                               # [n, C]
    total = reported.sum(axis=0)                                             # [C]
    mean = (means.astype(np.float64) * reported[:, :, None]).sum(axis=0) / \
        np.maximum(total, 1.0)[:, None]
    seen = total > 0
    old = np.zeros_like(mean) if protos is None else protos.astype(np.float64)
    old_has = np.zeros(seen.shape, bool) if has is None else has
    return np.where(seen[:, None], mean, old).astype(np.float32), old_has | seen


@AGGREGATORS.register("fedproto")
class FedProtoAggregation(Aggregator):
    """Averages the devices' class prototypes; there is no global model to aggregate."""

    #: parameters never travel (training.exchange: personal)
    personal = True

    def __init__(self, params: object) -> None:
        self.params = params
        self.protos: dict[str, np.ndarray] = {}
        self.has: dict[str, np.ndarray] = {}
        self._payload: tuple[int, dict[str, np.ndarray]] | None = None

    @staticmethod
    def check_scenario(params: object, scenario: Scenario,
                       sensors: tuple[str, ...] | None) -> list[str]:
        problems = []
        if scenario.objective.name != "fedproto":
            problems.append("aggregation.name: fedproto averages the prototypes that objective "
                            f"fedproto reports (got objective {scenario.objective.name!r})")
        if scenario.training.exchange != "personal":
            problems.append("training.exchange: FedProto keeps every model on its device and "
                            "exchanges prototypes only: set training.exchange: personal")
        if scenario.eval.scope != "devices":
            problems.append("eval.scope: FedProto has no global model to evaluate on the pooled "
                            "test split; set eval.scope: devices (each device's own model)")
        return problems

    def aggregate(self, params: dict[str, np.ndarray], batch: UpdateBatch,
                  ctx: AggregationContext) -> dict[str, np.ndarray]:
        for key in batch.extras:
            if key.startswith(MEANS):
                s = key[len(MEANS):]
                self.protos[s], self.has[s] = average_prototypes(
                    batch.extras[key], batch.extras[COUNTS + s], self.protos.get(s),
                    self.has.get(s))
        return dict(params)

    def _current(self) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {}
        for s, p in self.protos.items():
            out[PROTO + s] = p.copy()
            out[MASK + s] = self.has[s].astype(np.float32)
        return out

    def extras(self, round: int) -> dict[str, np.ndarray]:
        """The global prototypes broadcast this round. Memoised per round: the server asks
        again after aggregating to count the bytes it sent, which were the ones before."""
        if self._payload is None or self._payload[0] != round:
            self._payload = (round, self._current())
        return self._payload[1]

    def eval_extras(self) -> dict[str, np.ndarray]:
        """What per-device evaluation needs: the prototypes as they are now."""
        return self._current()

    def extras_uplink_bytes(self, batch: UpdateBatch) -> np.ndarray:
        """Bytes each device sent: F floats and one count per (space, class) it holds."""
        up = np.zeros(batch.n, np.int64)
        for key, means in batch.extras.items():
            if key.startswith(MEANS):
                held = (batch.extras[COUNTS + key[len(MEANS):]] > 0).sum(axis=1)
                up += held.astype(np.int64) * (means.shape[2] + 1) * FLOAT_BYTES
        return up

    def state_dict(self) -> dict[str, Any]:
        return {"protos": {s: p.copy() for s, p in self.protos.items()},
                "has": {s: h.copy() for s, h in self.has.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.protos = {s: np.asarray(p, np.float32).copy() for s, p in state["protos"].items()}
        self.has = {s: np.asarray(h, bool).copy() for s, h in state["has"].items()}
        self._payload = None
