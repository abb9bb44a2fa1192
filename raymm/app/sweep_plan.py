"""A sweep's jobs: one per (scenario or method variant, grid point, seed), each with a run
directory it can find again, and what a re-run of the sweep does with it.

A job's directory is `<root>/<scenario name>-seed<seed>` (a grid point's name carries its
values: `raymm.app.grid`) (its log `<...>.log` next to it), so
running the same sweep command again finds every run it started: a finished one is skipped, an
interrupted one continues from its newest checkpoint, one that never checkpointed starts over.
A directory that holds a run of another configuration is never reused or overwritten: the sweep
refuses to start and names it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from raymm.app.build import load_scenario, with_executor
from raymm.app.grid import GridPoint, grid_name, grid_points
from raymm.app.variants import method_scenarios
from raymm.config.schema import Scenario, read_yaml
from raymm.driver import checkpoint
from raymm.errors import RaymmError, ScenarioError
from raymm.io.atomic import is_leftover
from raymm.io.paths import CONFIG_FILE

#: what a job needs: run it, continue it, start it over, nothing (done), or nothing because it
#: diverged last time (deterministic: it would again)
Action = Literal["new", "resume", "restart", "done", "diverged"]


@dataclass(frozen=True)
class Job:
    """One run of a sweep: its resolved scenario (validated) and its run directory."""

    scenario: Scenario
    run_dir: Path

    @property
    def label(self) -> str:
        return f"{self.scenario.name} seed {self.scenario.seed}"

    @property
    def log(self) -> Path:
        """stdout and stderr of the run's process, next to (not inside) its directory."""
        return self.run_dir.with_name(self.run_dir.name + ".log")


def plan_jobs(scenarios: Sequence[str | Path], seeds: Sequence[int], overrides: Sequence[str],
              root: Path, methods: Sequence[str] | None = None,
              executor: str | None = None, grid: Sequence[str] = ()) -> list[Job]:
    """Every (scenario or method variant, grid point, seed) validated, in sweep order; a
    method skipped under `--methods all` is printed. `grid`: `--grid key=v1,v2` items
    (`raymm.app.grid`), applied after `overrides`. Two jobs that would share a directory (the
    same scenario name and seed) are refused: they would overwrite each other or silently
    count once."""

    seed_sets = [[f"seed={s}"] for s in seeds] or [[]]
    points = grid_points(grid)
    sources: list[tuple[Any, list[str], GridPoint]] = []
    for path in scenarios:
        for point in points:
            sets = [*overrides, *point.overrides]
            if methods:
                variants, skipped = method_scenarios(path, methods, sets)
                where = f" (at {' '.join(point.overrides)})" if point.overrides else ""
                for note in skipped:
                    verb = "notice:" if "does not apply" in note else "skipping"
                    print(f"raymm sweep: {verb} {note}{where}")
                # a variant already carries the overrides
                sources += [(v, [], point) for v in variants]
            else:
                sources.append((path, sets, point))
    jobs: list[Job] = []
    for source, sets, point in sources:
        for extra in seed_sets:
            sc = load_scenario(source, [*sets, *extra])
            if point.suffix:   # validated again under its own name (a name has limits)
                sc = load_scenario(source, [*sets, *extra, f"name={grid_name(sc.name, point)}"])
            sc = with_executor(sc, executor)
            jobs.append(Job(sc, root / f"{sc.name}-seed{sc.seed}"))
    seen: dict[Path, Job] = {}
    clashes = []
    for job in jobs:
        if job.run_dir in seen:
            clashes.append(f"two jobs named {job.scenario.name!r} with seed {job.scenario.seed} "
                           f"would share {job.run_dir}; give the scenarios different names")
        seen[job.run_dir] = job
    if clashes:
        raise ScenarioError(sorted(set(clashes)))
    return jobs


def actions_of(jobs: Sequence[Job]) -> list[Action]:
    """`action_of` every job; the refusals of all of them in one RaymmError."""
    actions, refused = [], []
    for job in jobs:
        try:
            actions.append(action_of(job))
        except RaymmError as exc:
            refused.append(str(exc))
    if refused:
        raise RaymmError("\n".join(refused))
    return actions


def action_of(job: Job) -> Action:
    """What the job's run directory asks for. Raises RaymmError (naming the directory) when it
    holds something other than a run of this job's scenario: another configuration, or files
    that are not a run at all."""
    d = job.run_dir
    entries = list(d.iterdir()) if d.is_dir() else None
    if not d.exists() or entries == []:
        return "new"
    if entries and all(is_leftover(e) for e in entries):
        return "restart"   # only what a write cut short left (a sweep killed mid-pull)
    if not (d / CONFIG_FILE).is_file():
        raise RaymmError(f"sweep: {d} exists but is not a run directory (no {CONFIG_FILE}); "
                         "move it away or choose another --out")
    if saved_digest(d) != checkpoint.scenario_digest(job.scenario.to_dict()):
        raise RaymmError(f"sweep: {d} holds a run of another configuration than "
                         f"{job.label} (its {CONFIG_FILE} differs: another --set, or the scenario "
                         "file changed); delete it or choose another --out")
    ended = _ended(d)
    if ended == "completed":
        return "done"
    if ended == "diverged":
        return "diverged"
    return "resume" if checkpoint.latest(d) is not None else "restart"


def saved_digest(d: Path) -> str:
    """The scenario identity (`checkpoint.scenario_digest`: all but execution and output) of
    the run in `d`, read back through validation like a resumed run's."""

    try:
        saved = load_scenario(read_yaml(d / CONFIG_FILE))
    except (RaymmError, OSError, ValueError) as exc:
        raise RaymmError(f"sweep: {d}/{CONFIG_FILE} is unreadable: {exc}") from None
    return checkpoint.scenario_digest(saved.to_dict())


def _ended(d: Path) -> str | None:
    """summary.json's `ended` (None: no summary yet; a summary written before the field
    existed is a finished run's)."""
    try:
        summary = json.loads((d / "summary.json").read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise RaymmError(f"sweep: {d}/summary.json is unreadable: {exc}") from None
    if not isinstance(summary, dict):
        raise RaymmError(f"sweep: {d}/summary.json is not a raymm summary")
    ended = summary.get("ended", "completed")
    return ended if isinstance(ended, str) else "completed"
