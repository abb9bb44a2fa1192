"""The round loop of a run: log each round, checkpoint, stop early, and handle Ctrl-C.

`raymm.sim.engine` says what one round is; this module drives the rounds of a run around it:
every round's row goes to the tracker (best accuracy, Acc@B, early stopping), the run
directory and the caller's hook; checkpoints are written every `output.checkpoint_every`
rounds and when the user interrupts.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from raymm.config.schema import Scenario
from raymm.driver import checkpoint, progress
from raymm.driver.rundir import RunWriter
from raymm.driver.tracking import RunTracker
from raymm.protocol.record import RoundRecord
from raymm.sim.engine import Executor, World, is_eval_round, run_rounds


@dataclass(frozen=True)
class LoopEnd:
    """How the rounds ended: the last completed round, the run's wall time so far (resumed
    runs included), whether the user interrupted, and the first divergence (round, devices)."""

    last: int
    wall: float
    interrupted: bool
    diverged: tuple[int, list[int]] | None


def drive(sc: Scenario, world: World, ex: Executor, writer: RunWriter, first: int,
          wall_before: float, show_progress: bool,
          user_hook: Callable[[dict[str, Any]], bool | None] | None = None) -> LoopEnd:
    """Rounds `first..sc.rounds` (fewer when stopped), each logged to `writer`; the rounds
    table is flushed at the end, and a checkpoint written when the user interrupted."""
    bar = progress.progress_bar(sc, show_progress, first - 1)
    digest = checkpoint.scenario_digest(sc.to_dict())
    # a staged method (e.g. Harmony) counts early-stopping patience in its last stage only
    tracker = RunTracker(sc.eval.budget_gib, sc.eval.early_stop_patience,
                         int(world.policies.schedule.final_stage_start))
    for row in writer.rows:  # a resumed run replays its history (best so far, patience)
        tracker.update(row)
    t0 = time.perf_counter()

    def save_checkpoint(t: int) -> None:
        checkpoint.save(writer.path, checkpoint.Checkpoint(
            t, digest, ex.server_state(), ex.host_states(), list(writer.rows),
            wall_before + time.perf_counter() - t0, dict(writer.selected)),
            sc.output.keep_checkpoints)

    # (round, devices) once training produced non-finite numbers
    diverged: list[tuple[int, list[int]]] = []
    with StopOnInterrupt() as stop:
        def on_round(record: RoundRecord) -> bool:
            row, bad = record.row, record.diverged
            if bad is not None:
                diverged.append((row["round"], bad))
            # privacy.target_epsilon with on_target: stop: the next release would pass it
            early_stop = tracker.update(row) or bad is not None \
                or bool(row.get("privacy/budget_reached"))
            writer.log_round(record)
            if user_hook is not None:
                early_stop = bool(user_hook(row)) or early_stop
            t = row["round"]
            every = sc.output.checkpoint_every
            if is_eval_round(t, sc) or "accuracy" in row or (every and t % every == 0) \
                    or stop.requested:
                writer.flush_rounds()
            if every and t % every == 0 and not stop.requested:
                save_checkpoint(t)
            progress.advance(bar, writer.rows)
            progress.say_faults(row, bar)
            return stop.requested or early_stop

        # an asynchronous run (raymm.sim.async_loop) drives its own events
        own = getattr(ex, "run_rounds", None)
        last = own(sc, first, on_round, writer.tb) if own is not None \
            else run_rounds(ex, sc, first, on_round)
    if bar is not None:
        bar.close()
    wall = wall_before + time.perf_counter() - t0
    writer.flush_rounds()
    if stop.requested:
        save_checkpoint(last)
    return LoopEnd(last, wall, stop.requested, diverged[0] if diverged else None)


class StopOnInterrupt:
    """First Ctrl-C: finish the round in flight, then stop cleanly. Second: stop at once."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: Any = None

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        print("\nraymm: stopping after this round (Ctrl-C again to abort at once)",
              file=sys.stderr, flush=True)

    def __enter__(self) -> StopOnInterrupt:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
