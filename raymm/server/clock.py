"""The synchronous round on one simulated clock (`clock.mode: seconds`; docs/time.md).

The server keeps the clock: a round starts when the previous one ended (or, when no device is
available then, at the first arrival: idle time), selection sees who is available at that
instant, and the round ends by `raymm.population.clock.close_round` from each selected device's
compute and traffic seconds and the end of its availability interval. Simulator bookkeeping
only: a policy sees the online set, never a departure time.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from raymm.config.schema import Scenario
from raymm.population.clock import RoundClose, close_round
from raymm.population.devices import Population


class RoundClock:
    """The clock of a synchronous run in seconds: where the current round started, how it
    ended, and the run's totals of device work and wasted work."""

    def __init__(self, scenario: Scenario, population: Population) -> None:
        self.av = population.availability
        self.num_samples = population.num_samples
        c, k = scenario.clock, scenario.selection.k
        kth = c.round_end == "kth"
        self.keep = k if kth else None
        self.k_select = min(population.n, math.ceil(k * (1 + c.overcommit))) if kth else k
        self.deadline = scenario.faults.deadline_seconds
        self.start = self.idle = self.duration = 0.0
        self.work_total = self.wasted_total = 0.0
        self.departed_total = 0
        self._last: RoundClose | None = None

    def begin(self, now: float) -> np.ndarray:
        """Sorted ids available when the round starts: at `now`, or at the first arrival after
        it when nobody is available (the clock idles until then)."""
        on = self.av.available(now)
        start = float(now)
        if not on.any():
            nxt = float(np.min(self.av.next_arrival(now)))
            if math.isfinite(nxt):
                start = nxt
                on = self.av.available(start)
                if not on.any():  # the arrival fell a rounding error short of its interval
                    start = nxt + 1e-6 * max(1.0, abs(nxt))
                    on = self.av.available(start)
        self.start, self.idle = start, start - float(now)
        return np.flatnonzero(on).astype(np.int64)

    def close(self, device_ids: np.ndarray, seconds: np.ndarray) -> np.ndarray:
        """bool per device of the batch: its update is not aggregated (it departed, or was
        still working when the round ended). Sets `duration`."""
        stay = self.av.departure(self.start, device_ids) - self.start
        rc = close_round(seconds, stay, self.deadline, self.keep)
        self._last, self.duration = rc, rc.duration
        self.work_total += float(rc.work.sum())
        self.wasted_total += float(rc.wasted.sum())
        self.departed_total += int(rc.departed.sum())
        return ~rc.kept

    def row(self) -> dict[str, Any]:
        """The round's clock columns for rounds.parquet."""
        rc = self._last
        departed = int(rc.departed.sum()) if rc is not None else 0
        dropped = int(rc.dropped.sum()) if rc is not None else 0
        work = float(rc.work.sum()) if rc is not None else 0.0
        wasted = float(rc.wasted.sum()) if rc is not None else 0.0
        self._last = None
        return {"sim_start_seconds": self.start, "idle_seconds": self.idle,
                "departed": departed, "stragglers": dropped,
                "work_seconds": work, "wasted_seconds": wasted,
                "work_seconds_total": self.work_total, "wasted_seconds_total": self.wasted_total,
                "wasted_share": self.wasted_total / self.work_total if self.work_total else 0.0}

    def state_dict(self) -> dict[str, Any]:
        return {"start": self.start, "idle": self.idle, "work_total": self.work_total,
                "wasted_total": self.wasted_total, "departed_total": self.departed_total}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.start, self.idle = float(state["start"]), float(state["idle"])
        self.work_total = float(state["work_total"])
        self.wasted_total = float(state["wasted_total"])
        self.departed_total = int(state["departed_total"])
