"""When each device is available, in simulated seconds: the one clock every mode reads.

A device is available in intervals [start, end) of simulated time. Two sources give them:

- `PeriodicAvailability`: today's round-indexed patterns, (k + φ_i) mod D_i < d_i, read on a
  seconds axis where slot k (round k of the round-indexed clock) covers
  [(k-1)·S, k·S) for `slot_seconds` S. Round t of the round clock is therefore the instant
  (t-1)·S, and the periodic pattern gives exactly the online sets it gave per round.
- `TraceAvailability`: intervals read from a device trace (`raymm.population.traces.Trace`),
  each device mapped to one trace entry. Simulated second 0 is the trace's earliest observed
  instant (its common axis), and an entry's observed window [w0, w1) repeats with its period
  in both directions: a run that outlasts the window reads it again from its start, and an
  instant before w0 (an entry observed later than the first) reads the window a whole number
  of periods later, not "offline" (docs/time.md says why).

The API (stable; the asynchronous loop and the synchronous round both use it), every method
vectorised over `devices` (int ids, default: all) at one instant `seconds`:

- `available(seconds, devices) -> bool [n]`: whether each device is in an interval then.
- `departure(seconds, devices) -> float64 [n]`: when the interval it is in ends (when it
  leaves; +inf for one that never leaves); `seconds` itself for a device not available.
- `next_arrival(seconds, devices) -> float64 [n]`: when its next interval starts: `seconds` for
  a device available now, +inf for one never available again.

A device's own compute and traffic seconds are `Population.compute_seconds` and
`Population.traffic_seconds` (raymm.population.devices).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

if TYPE_CHECKING:
    from raymm.population.traces import Trace


class Availability(Protocol):
    """Availability of devices 0..n-1 over simulated seconds (see the module docstring)."""

    @property
    def n(self) -> int: ...

    def available(self, seconds: float, devices: np.ndarray | None = None) -> np.ndarray: ...

    def departure(self, seconds: float, devices: np.ndarray | None = None) -> np.ndarray: ...

    def next_arrival(self, seconds: float, devices: np.ndarray | None = None) -> np.ndarray: ...


def _ids(devices: np.ndarray | None, n: int) -> np.ndarray | slice:
    return slice(0, n) if devices is None else np.asarray(devices, np.int64)


@dataclass(frozen=True)
class PeriodicAvailability:
    """Round-indexed periodic patterns on the seconds axis: slot k is [(k-1)·S, k·S)."""

    period: np.ndarray        # int [n]: D_i, in slots
    online_len: np.ndarray    # int [n]: d_i, slots online per period
    phase: np.ndarray         # int [n]: φ_i
    slot_seconds: float       # S

    @property
    def n(self) -> int:
        return int(self.period.shape[0])

    def slot(self, seconds: float) -> int:
        """The slot (round index of the round clock) that holds instant `seconds`."""
        return int(np.floor(seconds / self.slot_seconds)) + 1

    def _position(self, seconds: float, devices: np.ndarray | None
                  ) -> tuple[int, np.ndarray, np.ndarray, np.ndarray]:
        idx = _ids(devices, self.n)
        k = self.slot(seconds)
        period = self.period[idx].astype(np.int64)
        return k, (k + self.phase[idx].astype(np.int64)) % period, period, \
            self.online_len[idx].astype(np.int64)

    def available(self, seconds: float, devices: np.ndarray | None = None) -> np.ndarray:
        _, pos, _, online = self._position(seconds, devices)
        return pos < online

    def departure(self, seconds: float, devices: np.ndarray | None = None) -> np.ndarray:
        k, pos, period, online = self._position(seconds, devices)
        end = (k - 1 + online - pos).astype(np.float64) * self.slot_seconds
        end = np.where(online >= period, np.inf, end)
        return np.where(pos < online, end, float(seconds))

    def next_arrival(self, seconds: float, devices: np.ndarray | None = None) -> np.ndarray:
        k, pos, period, online = self._position(seconds, devices)
        start = (k - 1 + period - pos).astype(np.float64) * self.slot_seconds
        start = np.where(online <= 0, np.inf, start)
        return np.where(pos < online, float(seconds), start)


@dataclass(frozen=True)
class TraceAvailability:
    """Devices mapped onto the entries of a trace (`entry[i]`: device i's entry)."""

    trace: Trace
    entry: np.ndarray         # int [n]: index of each device's trace entry

    @property
    def n(self) -> int:
        return int(self.entry.shape[0])

    def _locate(self, seconds: float, devices: np.ndarray | None
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Per device: its entry, its local time τ in the entry's window (relative to w0),
        the index of the last interval starting at or before τ (-1: none), and whether
        τ lies inside that interval."""
        tr = self.trace
        e = self.entry[_ids(devices, self.n)].astype(np.int64)
        w0, span = tr.window_start[e], tr.span[e]
        tau = np.mod(tr.origin + float(seconds) - w0, span)
        idx = np.searchsorted(tr.keys, e * tr.stride + tau, side="right") - 1
        idx = np.where(idx >= tr.offsets[e], idx, -1)
        safe = np.maximum(idx, 0)
        inside = (idx >= 0) & (tau < tr.ends[safe] - w0)
        return e, tau, idx, inside

    def available(self, seconds: float, devices: np.ndarray | None = None) -> np.ndarray:
        return self._locate(seconds, devices)[3]

    def departure(self, seconds: float, devices: np.ndarray | None = None) -> np.ndarray:
        tr = self.trace
        e, tau, idx, inside = self._locate(seconds, devices)
        safe = np.maximum(idx, 0)
        w0, span = tr.window_start[e], tr.span[e]
        left = tr.ends[safe] - w0 - tau
        # an interval that runs to the window's end continues into the repeat's first one
        # when that starts at w0 (the window wraps without a gap)
        first = tr.offsets[e]
        has = tr.offsets[e + 1] > first
        f = np.minimum(first, tr.starts.shape[0] - 1)
        wraps = inside & has & (tr.ends[safe] - w0 >= span) & (tr.starts[f] - w0 <= 0)
        left = np.where(wraps, left + (tr.ends[f] - tr.starts[f]), left)
        whole = wraps & (tr.ends[f] - w0 >= span)  # online the whole window: never leaves
        out = float(seconds) + left
        out = np.where(whole, np.inf, out)
        return np.where(inside, out, float(seconds))

    def next_arrival(self, seconds: float, devices: np.ndarray | None = None) -> np.ndarray:
        tr = self.trace
        e, tau, idx, inside = self._locate(seconds, devices)
        w0, span = tr.window_start[e], tr.span[e]
        nxt = np.where(idx >= 0, idx + 1, tr.offsets[e])
        in_entry = nxt < tr.offsets[e + 1]
        safe = np.minimum(nxt, tr.starts.shape[0] - 1)
        wait = np.where(in_entry, tr.starts[safe] - w0 - tau, np.nan)
        first = np.minimum(tr.offsets[e], tr.starts.shape[0] - 1)
        has = tr.offsets[e + 1] > tr.offsets[e]
        wrap = span - tau + (tr.starts[first] - w0)
        wait = np.where(in_entry, wait, np.where(has, wrap, np.inf))
        return np.where(inside, float(seconds), float(seconds) + wait)


def online_counts(av: Availability, edges: np.ndarray,
                  devices: np.ndarray | None = None) -> np.ndarray:
    """int [len(edges)]: devices available at each instant of `edges` (e.g. bins of a
    timeline for TensorBoard)."""
    return np.array([int(av.available(float(s), devices).sum()) for s in edges], np.int64)
