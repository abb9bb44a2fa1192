"""How a synchronous round ends on the simulated clock (`clock.mode: seconds`), as pure numpy.

Every selected device starts at the round's start; it needs `finish` seconds (its compute, then
its traffic) and stays `stay` seconds (until its availability interval ends). The rules:

- A device whose interval ends before it finishes *departs*: its update is lost and the time it
  spent until it left is wasted work.
- `keep` (round_end: kth): the round ends at the keep-th completion; the first `keep` finishers
  are kept, the others (over-committed devices still working) are stopped then.
- Otherwise the round ends when every device has finished or departed (the server learns of a
  departure when it happens), or at the deadline if that comes first.
- A device still working when the round ends (past the deadline, after the keep-th completion)
  is dropped; its time until the end is wasted work.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class RoundClose:
    """Per device of the round: kept, departed or dropped at the end, and its work."""

    kept: np.ndarray        # bool [n]: its update is aggregated
    departed: np.ndarray    # bool [n]: it left before it finished
    dropped: np.ndarray     # bool [n]: still working when the round ended
    duration: float         # seconds from the round's start to its end
    work: np.ndarray        # float64 [n]: seconds each device spent on the round
    wasted: np.ndarray      # float64 [n]: of which spent on an update not aggregated


def close_round(finish: np.ndarray, stay: np.ndarray, deadline: float | None = None,
                keep: int | None = None) -> RoundClose:
    """The round's end (see the module docstring). `finish` and `stay` are seconds from the
    round's start; ties in completion are broken by position (device id order)."""
    finish = np.asarray(finish, np.float64)
    stay = np.asarray(stay, np.float64)
    n = finish.shape[0]
    left = stay < finish
    stop = np.where(left, stay, finish)
    ok = ~left if deadline is None else ~left & (finish <= deadline)
    if n == 0:
        z = np.zeros(0, bool)
        return RoundClose(z, z, z, 0.0, np.zeros(0), np.zeros(0))
    if keep is not None and 0 < keep <= int(ok.sum()):
        order = np.flatnonzero(ok)[np.argsort(finish[ok], kind="stable")]
        kept = np.zeros(n, bool)
        kept[order[:keep]] = True
        end = float(finish[order[keep - 1]])
    else:
        end = float(stop.max())
        if deadline is not None:
            end = min(end, float(deadline))
        kept = ok & (finish <= end)
    departed = left & (stay <= end)
    dropped = ~kept & ~departed
    work = np.minimum(stop, end)
    return RoundClose(kept, departed, dropped, end, work, np.where(kept, 0.0, work))
