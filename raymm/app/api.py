"""`raymm.run`: the one entry point shared by the CLI and scenario scripts.

`run` only sequences the parts, each in a module of its own: `raymm.app.build` (scenario ->
data, population, policies, executor), `raymm.app.resume` (continue from a checkpoint),
`raymm.driver.loop` (the rounds, checkpoints, Ctrl-C), `raymm.driver.progress` (what is shown
meanwhile) and `raymm.driver.summary` (what the run reports at its end).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from raymm.app.build import build_world, load_scenario, make_executor, with_executor
from raymm.app.resume import reopen, resolve_resume
from raymm.config.schema import Scenario
from raymm.driver.loop import LoopEnd, drive
from raymm.driver.rundir import RunWriter, named_run_dir, new_run_dir
from raymm.driver.summary import devices_table, finish_run
from raymm.errors import Interrupted, RaymmError
from raymm.io.paths import writable_dir_problem
from raymm.server import divergence
from raymm.sim.engine import World

__all__ = ["RunResult", "run"]


@dataclass
class RunResult:
    run_dir: Path
    summary: dict[str, Any]
    rows: list[dict[str, Any]]
    params: dict[str, np.ndarray]


def run(scenario: str | Path | Mapping[str, Any] | Scenario | None = None,
        overrides: Sequence[str] = (), out: str | Path | None = None,
        executor: str | None = None, progress: bool = False,
        resume: str | Path | None = None,
        on_round: Callable[[dict[str, Any]], bool | None] | None = None,
        run_dir: str | Path | None = None) -> RunResult:
    """Validate, build, run every round, and write the run directory. Returns the summary.

    With `resume=RUN_DIR` the run continues from that directory's newest checkpoint and ends
    with the same parameters and rounds table as an uninterrupted run. `on_round` is called
    with each round's row once it is logged (outside the round's timed wall); returning True
    stops the run after that round, as early stopping does. `run_dir` names the run
    directory itself instead of a new `<out>/<name>-<time>` (it must be absent or empty):
    sweeps give every job a directory they can find again.
    """
    ckpt = None
    if resume is not None:
        sc, resume_dir, ckpt = resolve_resume(resume, scenario, overrides)
    elif scenario is None:
        raise RaymmError("run: give a scenario, or resume a run directory")
    else:
        sc = scenario if isinstance(scenario, Scenario) else load_scenario(scenario, overrides)
    sc = with_executor(sc, executor)
    if ckpt is None:
        parent = Path(run_dir).parent if run_dir is not None else Path(
            out if out is not None else sc.output.dir)
        out_problem = writable_dir_problem(parent)
        if out_problem:
            raise RaymmError(out_problem)
    ex = make_executor(sc)
    try:
        # Ray and its actors start first: their process start and imports overlap the data
        ex.prestart(sc)
        world = build_world(sc)      # data errors surface here, before anything is written
        ex.start(world)
        if ckpt is None:
            writer = _new_run(sc, world, out, run_dir)
            first, wall_before = 1, 0.0
        else:
            writer = reopen(sc, world, ex, ckpt, resume_dir)
            first, wall_before = ckpt.round + 1, ckpt.wall_seconds
        ex.ready()  # hosts built and warmed up: round 1 is timed as a steady round
        end = drive(sc, world, ex, writer, first, wall_before, progress, on_round)
        summary, state = finish_run(sc, world, ex, writer, end.last, end.wall, _ended(sc, end))
    finally:
        ex.shutdown()
    if end.diverged is not None:
        round_, devices = end.diverged
        raise divergence.TrainingDiverged(round_, devices, sc, writer.path)
    if end.interrupted and end.last < sc.rounds:
        raise Interrupted(writer.path, end.last)
    params = {g: np.asarray(v) for g, v in state["params"].items()}
    return RunResult(writer.path, summary, writer.rows, params)


def _ended(sc: Scenario, end: LoopEnd) -> str:
    """summary.json's `ended`: whether the run is over (`completed`, early stops included),
    can continue from its checkpoint (`interrupted`), or stopped on non-finite numbers
    (`diverged`). A sweep re-run skips, resumes or reports the run by it."""
    if end.diverged is not None:
        return "diverged"
    return "interrupted" if end.interrupted and end.last < sc.rounds else "completed"


def _new_run(sc: Scenario, world: World, out: str | Path | None,
             run_dir: str | Path | None = None) -> RunWriter:
    """A fresh run directory with its config, devices table and first pictures."""
    path = named_run_dir(run_dir) if run_dir is not None else new_run_dir(
        out if out is not None else sc.output.dir, sc.name)
    writer = RunWriter(path, sc.to_dict(), sc.output.tensorboard,
                       budget_gib=sc.eval.budget_gib)
    writer.add_text("scenario", "```yaml\n" + (path / "config.yaml").read_text() + "```")
    writer.write_devices(devices_table(world.population))
    writer.start_pictures(world.population, world.dataset, sc.rounds)
    return writer
