"""`raymm sweep`: run a list of scenarios (or one scenario under several methods) over seeds,
skipping finished runs and continuing interrupted ones, then tabulate them side by side.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

from raymm.app.plugins import load as load_plugins
from raymm.app.sweep_cluster import on_cluster, run_on_cluster
from raymm.app.sweep_exec import Outcome, run_jobs
from raymm.app.sweep_plan import Action, Job, actions_of, plan_jobs
from raymm.errors import RaymmError, ScenarioError
from raymm.results.tables import Comparison, compare, write_comparison


def run_sweep(scenarios: Sequence[str | Path], seeds: Sequence[int] = (),
              overrides: Sequence[str] = (), out: str | Path = "sweeps",
              executor: str | None = None, budget_gib: float | None = None,
              budget_from: str | None = None, progress: bool = False,
              methods: Sequence[str] | None = None, jobs: int | None = None,
              plugins: Sequence[str] = (), grid: Sequence[str] = (),
              address: str | None = None) -> Comparison:
    """Run every scenario for every seed (its own seed if `seeds` is empty) under `out/runs/`,
    `jobs` at a time (`raymm.app.sweep_exec`), then write the comparison table of the runs that
    finished under `out/`; the ones that failed are listed in the result's `failed`. With
    `methods` (names or ["all"]), every scenario runs under each method (`method_scenarios`);
    with `grid` (`key=v1,v2` items, `raymm.app.grid`), under every combination of the values.

    On a Ray cluster (`address`, or RAY_ADDRESS set as inside `ray job submit`) each run's
    driver runs as a Ray actor on a node with room for it and its DeviceActors, and its files
    come back under `out/runs/` as it goes (`raymm.app.sweep_cluster`); `jobs` then caps the
    runs at once (default: as many as the cluster fits).

    Every job is validated, and its run directory `out/runs/<name>-seed<seed>` checked, before
    the first run starts, so a typo in the last one does not cost the hours spent on the
    others. Running the same sweep again skips finished runs and continues interrupted ones
    from their checkpoints (`raymm.app.sweep_plan`). `plugins` are loaded first
    (`raymm.app.plugins`); runs in processes of their own load them too.
    """

    if jobs is not None and jobs < 1:
        raise RaymmError(f"sweep: --jobs must be at least 1, got {jobs}")
    load_plugins(plugins)
    planned = plan_jobs(scenarios, seeds, overrides, Path(out) / "runs", methods, executor, grid)
    names = list(dict.fromkeys(job.scenario.name for job in planned))
    if budget_from is not None and budget_from not in names:   # not hours later, at the table
        raise ScenarioError([f"--budget-from: no job runs scenario {budget_from!r}; the "
                             f"sweep's scenarios are: {', '.join(names)}"])
    actions = actions_of(planned)
    todo, failed = _announce(planned, actions)
    if on_cluster(address):
        ended = run_on_cluster(todo, address, jobs, _Reporter(len(todo)), plugins)
    else:
        ended = run_jobs(todo, jobs or 1, progress, _Reporter(len(todo)))
    failed += [f"{o.job.label}: {o.error}" + (f" (log: {o.log})" if o.log else "")
               for o in ended if not o.ok]
    ok = {o.job.run_dir for o in ended if o.ok}
    finished = [job for job, action in zip(planned, actions)
                if action == "done" or job.run_dir in ok]
    if not finished:
        return Comparison([], None, "no run finished\n", failed)
    if budget_from is not None and all(j.scenario.name != budget_from for j in finished):
        failed.append(f"--budget-from {budget_from}: none of its runs finished, so the table "
                      "has no Acc@B")
        budget_from = None
    comp = compare([job.run_dir for job in finished], budget_gib, budget_from)
    write_comparison(comp, out)
    return Comparison(comp.runs, comp.budget_gib, comp.markdown, failed)


def _announce(planned: Sequence[Job], actions: Sequence[Action]
              ) -> tuple[list[tuple[Job, Action]], list[str]]:
    """Say what each job's directory asks for; (the jobs to run, the failures already known:
    runs that diverged in an earlier sweep)."""
    todo: list[tuple[Job, Action]] = []
    failed: list[str] = []
    for job, action in zip(planned, actions):
        if action == "done":
            print(f"raymm sweep: skipping {job.label}: finished in {job.run_dir}")
        elif action == "diverged":
            failed.append(f"{job.label}: diverged in an earlier sweep ({job.run_dir}); not run "
                          "again, it would diverge the same way")
        else:
            if action == "resume":
                print(f"raymm sweep: resuming {job.label} from its checkpoint in {job.run_dir}")
            elif action == "restart":
                print(f"raymm sweep: restarting {job.label}: {job.run_dir} has no checkpoint")
            todo.append((job, action))
    return todo, failed


class _Reporter:
    """One line per ended run: scenario, seed, final accuracy, wall time."""

    def __init__(self, total: int) -> None:
        self.total, self.count = total, 0

    def __call__(self, outcome: Outcome) -> None:
        self.count += 1
        job, n = outcome.job, f"[{self.count}/{self.total}]"
        if outcome.ok:
            acc = json.loads((job.run_dir / "summary.json").read_text()).get("final_accuracy")
            shown = "–" if acc is None else f"{acc:.4f}"
            print(f"raymm sweep: {n} {job.label}: final accuracy {shown}, "
                  f"{outcome.seconds:.1f} s", flush=True)
        else:
            where = f"; log: {outcome.log}" if outcome.log else ""
            print(f"raymm sweep: {n} {job.label} FAILED after {outcome.seconds:.1f} s: "
                  f"{outcome.error}{where}", file=sys.stderr, flush=True)
