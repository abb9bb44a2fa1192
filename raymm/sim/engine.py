"""The round loop, written once for every executor.

An executor says *where* the steps run (in-process, or in Ray actors) and may return futures;
the engine says *what* a round is. Only the small per-round statistics are materialised here.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from raymm.config.schema import Scenario
from raymm.data.base import Dataset
from raymm.device.host import HostSpec
from raymm.population.devices import Population
from raymm.protocol.record import RoundRecord
from raymm.server.server import Policies
from raymm.training.lockstep.fallback import fallback_error, strict

#: prefix of the per-device metrics when a run reports them next to the pooled ones
PERSONAL = "personal_"


@dataclass(frozen=True)
class World:
    """Everything an executor needs to set up a run."""

    scenario: Scenario
    dataset: Dataset
    population: Population
    policies: Policies
    host_spec: HostSpec


@dataclass
class Trained:
    """What a train step produced: host results (or futures of them), the selected devices
    lost with a host that died this round, and how many hosts died."""

    results: list[Any]
    lost: list[np.ndarray]
    hosts_killed: int

    def lost_ids(self) -> np.ndarray:
        return np.sort(np.concatenate(self.lost)) if self.lost else np.zeros(0, np.int64)


class Executor(Protocol):
    """Where the steps of a round run. Step methods may return futures; `get` resolves them."""

    name: str

    def prestart(self, sc: Scenario) -> None:
        """Before the data is loaded: start what needs only the scenario (Ray, its actors), so
        that it overlaps the driver's work. `start` does it when nobody did."""
        ...

    def start(self, world: World) -> None: ...

    def ready(self) -> None:
        """Wait until everything `start` began is built and warmed up (before round 1)."""
        ...

    def poll(self, t: int) -> Any: ...

    def plan(self, t: int, reports: Any) -> Any: ...

    def train(self, t: int, planned: Any) -> Any: ...

    def aggregate(self, t: int, planned: Any, results: Any) -> Any:
        """The round's `RoundRecord` (or a future of it): its row, selected ids, divergence."""
        ...

    def evaluate(self, t: int) -> Any:
        """The pooled evaluation as a `RoundRecord` (its columns and confusion matrix)."""
        ...

    def evaluate_devices(self, t: int) -> Any:
        """Every host evaluates its own devices; the server turns the counts into metrics."""
        ...

    def get(self, value: Any) -> Any: ...

    def server_state(self) -> dict[str, Any]: ...

    def load_server_state(self, state: dict[str, Any]) -> None: ...

    def host_states(self) -> dict[int, np.ndarray]: ...

    def load_host_states(self, state: dict[int, np.ndarray]) -> None: ...

    def shutdown(self) -> None: ...


def is_eval_round(t: int, sc: Scenario) -> bool:
    return t % sc.eval.every == 0 or t == sc.rounds


def eval_due(row: dict[str, Any], sc: Scenario) -> bool:
    """Whether the round in `row` took the simulated clock past a multiple of
    `clock.eval_every_seconds` (evaluation every T simulated seconds)."""
    every = sc.clock.eval_every_seconds
    if every is None or "sim_seconds_total" not in row:
        return False
    end = float(row["sim_seconds_total"])
    before = end - float(row.get("sim_seconds", 0.0)) - float(row.get("idle_seconds", 0.0))
    return int(end // every) > int(before // every)


def plans_ahead(t: int, sc: Scenario) -> bool:
    """Whether round t+1 may be planned before round t has been handed to the driver: not
    after the last round, an evaluation (policies learn from it) or a checkpoint (which then
    holds no plan made ahead)."""
    every = sc.output.checkpoint_every
    # evaluation by simulated seconds is known only after the round: never plan ahead then
    return (sc.execution.plan_ahead and t < sc.rounds and not is_eval_round(t, sc)
            and not (every and t % every == 0) and sc.clock.eval_every_seconds is None)


def run_round(ex: Executor, t: int, sc: Scenario) -> RoundRecord:
    """One round: poll → plan (selection + schedule) → train → aggregate (+ evaluate). Under
    `RAYMM_STRICT_LOCKSTEP=1` a round whose devices fell back from lock-step training raises
    (`raymm.training.lockstep.fallback.strict`), wherever they trained."""
    wall0 = time.perf_counter()
    reports = ex.poll(t)
    planned = ex.plan(t, reports)
    results = ex.train(t, planned)
    record: RoundRecord = ex.get(ex.aggregate(t, planned, results))
    if record.lockstep_fallbacks and strict():
        raise fallback_error(f"round {t}", record.lockstep_fallbacks)
    if is_eval_round(t, sc) or eval_due(record.row, sc):
        record.merge(evaluate(ex, t, sc.eval.scope))
    record.row["wall_seconds"] = time.perf_counter() - wall0
    return record


def evaluate(ex: Executor, t: int, scope: str) -> RoundRecord:
    """The round's evaluation entries: the global model on the pooled test split, every device
    on its own test part, or both (the device entries then prefixed `personal_`, so the
    headline accuracy, early stopping and Acc@B stay those of the global model). Both
    evaluations are started before either is waited on."""
    pooled = ex.evaluate(t) if scope in ("pooled", "both") else None
    devices = ex.evaluate_devices(t) if scope in ("devices", "both") else None
    out: RoundRecord = ex.get(pooled) if pooled is not None else RoundRecord()
    if devices is not None:
        got = ex.get(devices)
        out.row.update(personal_entries(got) if scope == "both" else got)
    return out


def personal_entries(metrics: dict[str, Any]) -> dict[str, Any]:
    """Per-device metrics under their `personal_` names (`personal_accuracy`,
    `personal_acc_tier/<sensors>`, ...)."""
    return {f"{PERSONAL}{k}": v for k, v in metrics.items()}



def run_rounds(ex: Executor, sc: Scenario, first: int,
               on_round: Callable[[RoundRecord], bool | None]) -> int:
    """Rounds `first..sc.rounds`; `on_round` gets each round's record and may return True to
    stop.

    Returns the last completed round.
    """
    last = first - 1
    for t in range(first, sc.rounds + 1):
        record = run_round(ex, t, sc)
        last = t
        if on_round(record):
            break
    return last
