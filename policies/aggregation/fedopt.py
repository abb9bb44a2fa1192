"""Adaptive server optimizers (Reddi et al., ICLR 2021): FedAdagrad, FedAdam, FedYogi.

Per group, the server treats the sample-weighted mean update Δ_t = mean_i(x_i) - x_t as a
pseudo-gradient (with periodic sync, the weighted mean uploaded delta, which is the same
quantity over the window) and takes one step of its own optimizer (the paper's Algorithm 2):

    m_t = β1·m_{t-1} + (1 - β1)·Δ_t
    v_t = v_{t-1} + Δ_t²                                    (FedAdagrad)
    v_t = β2·v_{t-1} + (1 - β2)·Δ_t²                        (FedAdam)
    v_t = v_{t-1} - (1 - β2)·Δ_t²·sign(v_{t-1} - Δ_t²)      (FedYogi)
    x_{t+1} = x_t + η·m_t / (√v_t + τ)

with v_{-1} = τ² and m_{-1} = 0, no bias correction (as in the paper). m, v and the step count
are server state, saved in checkpoints. A group nobody sent keeps its vector and its moments.
Everything is float64 internally; the new vector is cast to float32.

Defaults: the paper's β1 = 0.9, β2 = 0.99, τ = 1e-3. The paper tunes the server learning rate
η per task on a grid of powers of ten; we take 1e-2 for FedAdam and FedYogi and 1e-1 for
FedAdagrad (whose v only grows, so its steps shrink faster), the orders of magnitude its tuning
favoured on image tasks. See docs/methods/fedopt.md.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field

from raymm.protocol.messages import UpdateBatch
from raymm.protocol.registry import AGGREGATORS
from raymm.protocol.seams import AggregationContext, Aggregator


class FedOptParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    #: η, the server learning rate
    eta: float = Field(default=1e-2, gt=0)
    #: β1, decay of the first moment m (0 = no momentum)
    beta1: float = Field(default=0.9, ge=0, lt=1)
    #: β2, decay of the second moment v (FedAdam, FedYogi; FedAdagrad ignores it)
    beta2: float = Field(default=0.99, ge=0, lt=1)
    #: τ, the adaptivity: added to √v, and v starts at τ²
    tau: float = Field(default=1e-3, gt=0)


class FedAdagradParams(FedOptParams):
    #: η, the server learning rate (larger than Adam's: v never decays)
    eta: float = Field(default=1e-1, gt=0)


def second_moment(rule: str, v: npt.NDArray[np.float64], delta: npt.NDArray[np.float64],
                  beta2: float) -> npt.NDArray[np.float64]:
    """v_t from v_{t-1} and Δ_t under `rule` ("adagrad", "adam" or "yogi"), float64."""
    d2 = delta * delta
    if rule == "adagrad":
        return v + d2
    if rule == "adam":
        return beta2 * v + (1.0 - beta2) * d2
    if rule == "yogi":
        return v - (1.0 - beta2) * d2 * np.sign(v - d2)
    raise ValueError(f"unknown second-moment rule {rule!r}")


def server_step(rule: str, x: np.ndarray, delta: np.ndarray, m: np.ndarray | None,
                v: np.ndarray | None, p: FedOptParams
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One adaptive server step: (new x as float32, m_t, v_t as float64). `m`/`v` None = the
    first step (m_{-1} = 0, v_{-1} = τ²). Inputs are not mutated."""
    d = delta.astype(np.float64)
    m_prev = np.zeros_like(d) if m is None else m
    v_prev = np.full_like(d, p.tau ** 2) if v is None else v
    m_t = p.beta1 * m_prev + (1.0 - p.beta1) * d
    v_t = second_moment(rule, v_prev, d, p.beta2)
    new = x.astype(np.float64) + p.eta * m_t / (np.sqrt(v_t) + p.tau)
    return new.astype(np.float32), m_t, v_t


class _FedOpt(Aggregator):
    """Shared server side of the three optimizers; subclasses name the second-moment rule."""

    Params = FedOptParams
    rule = ""
    #: the step depends on the updates only through their weighted mean: hosts may pre-sum
    combinable = True
    #: uploads are trained vectors (the pseudo-gradient is their mean minus the global vector)
    takes_deltas = False

    def __init__(self, params: FedOptParams | None) -> None:
        self.p = params or self.Params()
        self.m: dict[str, np.ndarray] = {}
        self.v: dict[str, np.ndarray] = {}
        self.steps: dict[str, int] = {}

    def pseudo_gradient(self, current: np.ndarray, mean: np.ndarray) -> np.ndarray:
        """Δ_t from the global vector and the weighted mean of the uploads."""
        if self.takes_deltas:
            return mean.astype(np.float64)
        return mean.astype(np.float64) - current.astype(np.float64)

    def aggregate(self, params: dict[str, np.ndarray], batch: UpdateBatch,
                  ctx: AggregationContext) -> dict[str, np.ndarray]:
        out = dict(params)
        for g in batch.groups():
            mean = batch.weighted_mean(g)
            if mean is None:
                continue
            delta = self.pseudo_gradient(params[g], mean)
            out[g], self.m[g], self.v[g] = server_step(self.rule, params[g], delta,
                                                       self.m.get(g), self.v.get(g), self.p)
            self.steps[g] = self.steps.get(g, 0) + 1
        return out

    def extras(self, round: int) -> dict[str, np.ndarray]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        # copies: the checkpoint must not alias arrays the next step replaces
        return {"m": {g: v.copy() for g, v in self.m.items()},
                "v": {g: v.copy() for g, v in self.v.items()}, "steps": dict(self.steps)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.m = {g: np.asarray(v, np.float64).copy() for g, v in state["m"].items()}
        self.v = {g: np.asarray(v, np.float64).copy() for g, v in state["v"].items()}
        self.steps = {g: int(s) for g, s in state["steps"].items()}


@AGGREGATORS.register("fedadagrad")
class FedAdagrad(_FedOpt):
    """Server Adagrad on the mean update: v accumulates Δ² without decay."""

    Params = FedAdagradParams
    rule = "adagrad"


@AGGREGATORS.register("fedadam")
class FedAdam(_FedOpt):
    """Server Adam on the mean update (no bias correction, as in the paper)."""

    rule = "adam"


@AGGREGATORS.register("fedyogi")
class FedYogi(_FedOpt):
    """Server Yogi on the mean update: v moves additively toward Δ²."""

    rule = "yogi"


# Periodic sync (training.exchange: delta, raymm.app.variants.PERIODIC_TWIN): devices upload their
# change since the window's base, which is the global vector the server holds at the sync, so
# the weighted mean delta is the pseudo-gradient itself. One server step per sync.
@AGGREGATORS.register("fedadagrad_delta")
class FedAdagradDelta(FedAdagrad):
    """FedAdagrad with periodic sync (training.exchange: delta): one step per sync on the
    weighted mean uploaded delta."""

    takes_deltas = True


@AGGREGATORS.register("fedadam_delta")
class FedAdamDelta(FedAdam):
    """FedAdam with periodic sync (training.exchange: delta): one step per sync on the
    weighted mean uploaded delta."""

    takes_deltas = True


@AGGREGATORS.register("fedyogi_delta")
class FedYogiDelta(FedYogi):
    """FedYogi with periodic sync (training.exchange: delta): one step per sync on the
    weighted mean uploaded delta."""

    takes_deltas = True
