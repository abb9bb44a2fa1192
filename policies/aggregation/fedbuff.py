"""FedBuff (Nguyen et al., AISTATS 2022): buffered asynchronous aggregation.

The server keeps `concurrency` (C) devices training; each trains from the model version it was
sent. Every `buffer` (M) arrivals the server takes one step per group over the devices that
sent the group:

    x ← x + η · Σ_i w_i f(s_i) Δ_i / Σ_i w_i

with Δ_i the arrival's trained vector minus the version it started from, s_i its staleness
(server versions since its dispatch), f the staleness discount (default 1/√(1+s), the
paper's), w_i its sample count (`weighting: samples`) or 1 (`uniform`, the paper's 1/M), and η
the server learning rate. The sum runs in arrival order, in float64; the new vector is
float32. With M = C, η = 1 and no staleness (every arrival from the current version) a step is
FedAvg's; the conditions under which a whole run is FedAvg's are in docs/methods/async.md.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from raymm.config.schema import Scenario
from raymm.protocol.asynchrony import (
    DISCOUNT_DEFAULTS,
    Arrivals,
    AsyncAggregator,
    Discount,
    discount,
)
from raymm.protocol.registry import AGGREGATORS


class AsyncParams(BaseModel):
    """What FedBuff and FedAsync share: the devices in flight and the staleness discount."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    #: C, devices in flight at once
    concurrency: int = Field(default=10, ge=1)
    #: f(s): poly (1+s)^-a, constant, or hinge (1 up to b, then 1/(a(s-b)+1))
    staleness: Discount = "poly"
    #: a of the discount; unset: the function's own from Xie et al. 2019 (poly 0.5, which is
    #: 1/√(1+s); hinge 10)
    staleness_a: float | None = Field(default=None, ge=0)
    #: b of the hinge discount; unset: Xie et al.'s 4 (hinge only)
    staleness_b: float | None = Field(default=None, ge=0)

    @model_validator(mode="before")
    @classmethod
    def _own_defaults(cls, data: object) -> object:
        """Fill an unset a and b from the chosen function's own defaults: a hinge must not
        inherit the polynomial's a."""
        if not isinstance(data, dict):
            return data
        own = DISCOUNT_DEFAULTS.get(data.get("staleness", "poly"), {})
        return {**data, **{f"staleness_{k}": v for k, v in own.items()
                           if data.get(f"staleness_{k}") is None}}


class FedBuffParams(AsyncParams):
    #: M, arrivals per server step
    buffer: int = Field(default=5, ge=1)
    #: η, the server learning rate
    server_lr: float = Field(default=1.0, gt=0)
    #: each arrival's weight: its sample count, or 1
    weighting: Literal["samples", "uniform"] = "samples"


def async_problems(scenario: Scenario, concurrency: int, buffer: int) -> list[str]:
    """What the asynchronous loop cannot run (shared by FedBuff and FedAsync)."""
    out = []
    if buffer > concurrency:
        out.append(f"aggregation.buffer ({buffer}) must be at most aggregation.concurrency "
                   f"({concurrency}): only C devices are ever in flight")
    if concurrency > scenario.population.devices:
        out.append(f"aggregation.concurrency ({concurrency}) exceeds population.devices "
                   f"({scenario.population.devices})")
    if scenario.clock.mode != "seconds" or scenario.clock.round_end != "all":
        out.append("asynchronous aggregation runs on the seconds clock: set clock.mode: "
                   "seconds (the fedbuff and fedasync presets do) and leave clock.round_end "
                   "at all (there are no rounds to end)")
    if scenario.selection.name == "all_online":
        out.append("selection all_online ignores the free slots; an asynchronous server fills "
                   "C slots (use random, least_selected, tide, ...)")
    if scenario.training.exchange != "params":
        out.append("asynchronous aggregation needs training.exchange: params (each device "
                   "trains from the version it is sent)")
    if scenario.privacy.on:
        out.append("asynchronous aggregation does not support privacy (its noise is per round)")
    if scenario.eval.scope != "pooled":
        out.append("asynchronous aggregation evaluates the global model only (eval.scope: "
                   "pooled)")
    if scenario.faults.deadline_seconds is not None:
        out.append("asynchronous aggregation has no round deadline (faults.deadline_seconds)")
    return out


@AGGREGATORS.register("fedbuff")
class FedBuff(AsyncAggregator):
    """Buffered asynchronous aggregation with a staleness discount and a server step size."""

    Params = FedBuffParams

    def __init__(self, params: FedBuffParams | None) -> None:
        self.p = params or FedBuffParams()

    @staticmethod
    def check_scenario(params: FedBuffParams, scenario: Scenario, sensors: tuple[str, ...] | None
                       ) -> list[str]:
        return async_problems(scenario, params.concurrency, params.buffer)

    @property
    def concurrency(self) -> int:
        return self.p.concurrency

    @property
    def buffer(self) -> int:
        return self.p.buffer

    def apply(self, params: dict[str, np.ndarray], arrivals: Arrivals
              ) -> dict[str, np.ndarray]:
        out = dict(params)
        f = discount(self.p.staleness, arrivals.staleness, self.p.staleness_a,
                     self.p.staleness_b)
        w = arrivals.num_samples.astype(np.float64) if self.p.weighting == "samples" \
            else np.ones(arrivals.n)
        for g in sorted(arrivals.deltas):
            pos = arrivals.senders[g]
            total = float(w[pos].sum())
            if total <= 0:
                continue
            step = (w[pos] * f[pos]) @ arrivals.deltas[g].astype(np.float64) / total
            out[g] = (params[g].astype(np.float64) + self.p.server_lr * step).astype(np.float32)
        return out
