"""FedAsync (Xie et al., 2019): every arrival is mixed into the global model at once.

One server step per arrival (buffer M = 1), per group the arrival sent:

    x ← (1 - a) x + a x_i,   a = α · f(s)

with x_i the vector the device trained (from the version it was sent), s its staleness
(server versions since its dispatch) and f a staleness function: polynomial (1+s)^-a
(default), constant 1, or hinge (1 up to b, then 1/(a(s-b)+1)), each with the paper's own
parameters unless set (poly a = 0.5; hinge a = 10, b = 4: `DISCOUNT_DEFAULTS`).
`concurrency` devices train at once.
See docs/methods/async.md.
"""

from __future__ import annotations

import numpy as np
from pydantic import Field

from policies.aggregation.fedbuff import AsyncParams, async_problems
from raymm.config.schema import Scenario
from raymm.protocol.asynchrony import Arrivals, AsyncAggregator, discount
from raymm.protocol.registry import AGGREGATORS


class FedAsyncParams(AsyncParams):
    #: α, the mixing weight of a fresh arrival
    alpha: float = Field(default=0.6, gt=0, le=1)


@AGGREGATORS.register("fedasync")
class FedAsync(AsyncAggregator):
    """Each arrival mixed in with weight α·f(staleness)."""

    Params = FedAsyncParams

    def __init__(self, params: FedAsyncParams | None) -> None:
        self.p = params or FedAsyncParams()

    @staticmethod
    def check_scenario(params: FedAsyncParams, scenario: Scenario, sensors: tuple[str, ...] | None
                       ) -> list[str]:
        return async_problems(scenario, params.concurrency, 1)

    @property
    def concurrency(self) -> int:
        return self.p.concurrency

    @property
    def buffer(self) -> int:
        return 1

    def apply(self, params: dict[str, np.ndarray], arrivals: Arrivals
              ) -> dict[str, np.ndarray]:
        out = {g: v.astype(np.float64) for g, v in params.items()}
        a = self.p.alpha * discount(self.p.staleness, arrivals.staleness, self.p.staleness_a,
                                    self.p.staleness_b)
        for g in sorted(arrivals.trained):
            for row, i in zip(arrivals.trained[g], arrivals.senders[g].tolist()):
                out[g] = (1.0 - a[i]) * out[g] + a[i] * row.astype(np.float64)
        return {g: v.astype(np.float32) if g in arrivals.trained else params[g]
                for g, v in out.items()}
