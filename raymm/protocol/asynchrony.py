"""What an asynchronous aggregator reads: the arrivals it merges and the staleness discount.

The asynchronous loop (`raymm.sim.async_loop`) keeps `concurrency` devices training, each from
the model version it was dispatched with, and hands the server's aggregator every `buffer`
arrivals as one `Arrivals`. Staleness s of an arrival = server versions aggregated since its
device was dispatched. An aggregator opts in by subclassing `AsyncAggregator`; the loop reads
only the attributes declared here, so `raymm.sim` never imports `policies`.
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass
from typing import Literal

import numpy as np

from raymm.protocol.messages import UpdateBatch
from raymm.protocol.seams import AggregationContext, Aggregator

#: staleness discounts f(s): poly (1+s)^-a, constant 1, hinge 1 up to b then 1/(a(s-b)+1)
Discount = Literal["poly", "constant", "hinge"]

#: each discount's own parameters where the configuration leaves them unset: the values of Xie,
#: Koyejo, Gupta, "Asynchronous Federated Optimization" (arXiv:1903.03934), in their
#: experiments: FedAsync+Poly a = 0.5, FedAsync+Hinge a = 10, b = 4. Poly with a = 0.5 is also
#: FedBuff's 1/√(1+s) (Nguyen et al., AISTATS 2022). A hinge that shared poly's a = 0.5 would
#: discount stale updates far less (f(6) = 0.5 instead of 1/21).
DISCOUNT_DEFAULTS: dict[str, dict[str, float]] = {
    "poly": {"a": 0.5}, "constant": {}, "hinge": {"a": 10.0, "b": 4.0}}


def discount(kind: str, staleness: np.ndarray, a: float | None = None,
             b: float | None = None) -> np.ndarray:
    """f(s) per arrival, float64 (Xie et al.'s FedAsync functions). `a` and `b` left at None
    take the function's own defaults (`DISCOUNT_DEFAULTS`)."""
    if kind not in DISCOUNT_DEFAULTS:
        raise ValueError(f"unknown staleness discount {kind!r}")
    own = DISCOUNT_DEFAULTS[kind]
    a = own.get("a", 0.0) if a is None else a
    b = own.get("b", 0.0) if b is None else b
    s = np.asarray(staleness, np.float64)
    if kind == "poly":
        return (1.0 + s) ** (-a)
    if kind == "hinge":
        return np.where(s <= b, 1.0, 1.0 / (a * (s - b) + 1.0))
    return np.ones_like(s)


@dataclass(frozen=True)
class Arrivals:
    """The updates that arrived since the last aggregation, in arrival order (simulated
    completion time, ties by device id).

    `trained[g]` float32 [n_g, P]: the vectors the senders of group g trained, `deltas[g]` the
    same minus the version each started from; `senders[g]` their positions in `device_ids`."""

    device_ids: np.ndarray     # int64 [n]
    num_samples: np.ndarray    # int64 [n]
    staleness: np.ndarray      # int64 [n]
    trained: dict[str, np.ndarray]
    deltas: dict[str, np.ndarray]
    senders: dict[str, np.ndarray]

    @property
    def n(self) -> int:
        return int(self.device_ids.shape[0])


class AsyncAggregator(Aggregator):
    """An aggregator of the asynchronous loop: `concurrency` devices in flight, one server step
    every `buffer` arrivals (`apply`). Never combinable: every arrival's row is needed."""

    combinable = False
    asynchronous = True

    @property
    @abstractmethod
    def concurrency(self) -> int:
        """C: devices kept training at once."""

    @property
    @abstractmethod
    def buffer(self) -> int:
        """M: arrivals per server step."""

    @abstractmethod
    def apply(self, params: dict[str, np.ndarray], arrivals: Arrivals
              ) -> dict[str, np.ndarray]:
        """The next model version from the current one and the buffered arrivals."""

    def aggregate(self, params: dict[str, np.ndarray], batch: UpdateBatch,
                  ctx: AggregationContext) -> dict[str, np.ndarray]:
        """A synchronous round is the buffer of its participants, none stale."""
        trained = {g: batch.updates[g] for g in batch.updates}
        return self.apply(params, Arrivals(
            batch.device_ids, batch.num_samples, np.zeros(batch.n, np.int64), trained,
            {g: rows - params[g] for g, rows in trained.items()}, dict(batch.senders)))
