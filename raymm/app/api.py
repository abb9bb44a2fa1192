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

from raymm.app.build import (
    build_world,
    load_scenario,
    make_executor,
    training_path_notice,
    with_executor,
)
from raymm.app.plugins import check_recorded
from raymm.app.plugins import load as load_plugins
from raymm.app.plugins import record as record_plugins
from raymm.app.resume import reopen, resolve_resume
from raymm.config.schema import Scenario
from raymm.driver.loop import LoopEnd, drive
from raymm.driver.rundir import EXPORTS, RunWriter, export_formats, named_run_dir, new_run_dir
from raymm.driver.summary import devices_table, finish_run
from raymm.errors import Interrupted, RaymmError
from raymm.io.paths import CONFIG_FILE, writable_dir_problem
from raymm.models import saved
from raymm.models.network import RaymmNet
from raymm.server import divergence
from raymm.sim.engine import World

__all__ = ["RunResult", "load_model", "run"]


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
        run_dir: str | Path | None = None, export: Sequence[str] = (),
        plugins: Sequence[str] = ()) -> RunResult:
    """Validate, build, run every round, and write the run directory. Returns a `RunResult`:
    the run directory, `summary.json`'s content, the rounds' rows and the final parameters.

    `scenario` is a YAML path, a dict, or a `Scenario`; `overrides` are `--set` strings
    (`"rounds=10"`); `out` is the folder the run directory goes in; `executor` is `"serial"`
    or `"ray"` (default: the scenario's own).

    `on_round(row)` is called in the driver process after each round is logged, with a copy
    of that round's row of `rounds.parquet` as a dict: `round`, `train_loss`, `bytes_total`,
    `selected`, ... and, on evaluated rounds only (`eval.every`, and the last), `accuracy`
    and the other metrics. The time it takes is not counted in the round's wall seconds.
    Returning True stops the run after that round, as early stopping does (the run still
    writes its tables, summary and model). For example, to follow the curve and stop at a
    target accuracy::

        curve = []

        def watch(row):
            acc = row.get("accuracy")          # absent on rounds that are not evaluated
            if acc is not None:
                curve.append((row["round"], acc))
            return acc is not None and acc >= 0.9

        result = raymm.run("scenarios/quickstart.yaml", executor="serial", on_round=watch)

    With `resume=RUN_DIR` the run continues from that directory's newest checkpoint and ends
    with the same parameters and rounds table as an uninterrupted run. `run_dir` names the
    run directory itself instead of a new `<out>/<name>-<time>` (it must be absent or empty):
    sweeps give every job a directory they can find again. `export=("csv",)` also writes the
    rounds as `rounds.csv` beside `rounds.parquet`, each time that is written (a resumed run
    keeps exporting when its directory holds a rounds.csv already).

    `plugins` names modules to import first (`raymm.app.plugins`: what they register, a
    scenario may name), as `raymm run --plugin` does; on Ray they reach every worker. A
    resumed run needs the plugins it was made with loaded again.
    """
    formats = export_formats(export)
    load_plugins(plugins)
    ckpt = None
    if resume is not None:
        check_recorded(Path(resume))
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
        training_path_notice(sc, world)
        ex.start(world)
        if ckpt is None:
            writer = _new_run(sc, world, out, run_dir)
            first, wall_before = 1, 0.0
        else:
            writer = reopen(sc, world, ex, ckpt, resume_dir)
            first, wall_before = ckpt.round + 1, ckpt.wall_seconds
            if (resume_dir / EXPORTS["csv"]).exists():  # exported before: keep it current
                formats = export_formats((*formats, "csv"))
        writer.export = formats
        ex.ready()  # hosts built and warmed up: round 1 is timed as a steady round
        hook = None if on_round is None else _row_copy_to(on_round)
        end = drive(sc, world, ex, writer, first, wall_before, progress, hook)
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


def _row_copy_to(on_round: Callable[[dict[str, Any]], bool | None]
                 ) -> Callable[[dict[str, Any]], bool | None]:
    """The caller's hook gets its own copy of the row: what it changes stays out of the table."""
    return lambda row: on_round(dict(row))


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
    writer.add_text("scenario", "```yaml\n" + (path / CONFIG_FILE).read_text() + "```")
    writer.write_devices(devices_table(world.population))
    writer.start_pictures(world.population, world.dataset, sc.rounds)
    record_plugins(path, sc)
    return writer


def load_model(run_dir: str | Path, device: int | None = None,
               plugins: Sequence[str] = ()) -> RaymmNet:
    """`raymm.models.saved.load_model` after importing `plugins` (and the installed entry-point
    plugins): a run whose model came from a plugin's factory needs that factory registered
    to rebuild the module. Nothing in the run directory is imported by itself."""
    load_plugins(plugins)
    return saved.load_model(run_dir, device)
