"""Sweeps: run a list of scenarios over seeds, and tabulate finished runs side by side.

Generic over methods: a run enters the table through its run directory (summary.json and
rounds.parquet) only. Acc@B is recomputed from each run's rounds for one common budget B, so B
can be fixed after the fact, e.g. as the paper does, as one method's mean total traffic
(`budget_from`).
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from raymm.errors import RaymmError, ScenarioError
from raymm.metrics import acc_at_budget
from raymm.rundir import atomic_write_bytes, atomic_write_table

if TYPE_CHECKING:
    from raymm.sweep_exec import Outcome
    from raymm.sweep_plan import Action, Job

#: per-run columns of the comparison table
COLUMNS = ("scenario", "seed", "method", "final", "best", "acc_at_budget", "acc_at_half_budget",
           "tier_f1", "worst_drop", "worst_drop_sensor", "gib_total", "final_personal_accuracy",
           "rounds_completed", "best_round", "fall_after_best", "wall_seconds_per_round",
           "run_dir")


@dataclass(frozen=True)
class Comparison:
    runs: list[dict[str, Any]]      # one record per run (COLUMNS)
    budget_gib: float | None
    markdown: str
    failed: list[str] = field(default_factory=list)  # a sweep's runs that did not finish


def run_record(run_dir: str | Path, budget_gib: float | None) -> dict[str, Any]:
    """One table row from a finished run directory; Acc@B recomputed for `budget_gib`."""
    d = Path(run_dir)
    summary, rows = read_run(d)
    rec = {k: summary.get(k) for k in COLUMNS}
    # Final is the last evaluation's accuracy, Best the highest of any evaluation
    rec.update(scenario=summary["name"], final=summary.get("final_accuracy"),
               best=summary.get("best_accuracy"), run_dir=str(d))
    # how far the curve fell from its best by the run's end: an early peak and a fall (e.g. a
    # global model trained on something other than what is evaluated) shows up here
    accs = [r["accuracy"] for r in rows if r.get("accuracy") is not None]
    rec["fall_after_best"] = max(accs) - accs[-1] if accs else None
    if budget_gib is not None:
        rec["acc_at_budget"] = acc_at_budget(rows, budget_gib)
        rec["acc_at_half_budget"] = acc_at_budget(rows, budget_gib / 2)
    return rec


def read_run(d: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """summary.json and rounds.parquet of a finished run; a damaged one is a RaymmError
    naming the file, not a traceback."""
    try:
        summary = json.loads((d / "summary.json").read_text())
        if not isinstance(summary, dict) or not isinstance(summary.get("name"), str):
            raise ValueError("not a raymm summary (no name)")
        for key in ("final_accuracy", "best_accuracy", "gib_total", "seed"):
            v = summary.get(key)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
                raise ValueError(f"{key} is {v!r}, not a number")
    except (OSError, ValueError, RecursionError) as exc:
        raise RaymmError(f"compare: {d / 'summary.json'} is unreadable: {exc}") from None
    try:
        rows = pq.read_table(d / "rounds.parquet").to_pylist()
    except (OSError, ValueError, pa.ArrowException) as exc:
        raise RaymmError(f"compare: {d / 'rounds.parquet'} is unreadable: {exc}") from None
    return summary, rows


def resolve_budget(records: list[dict[str, Any]], budget_gib: float | None,
                   budget_from: str | None) -> float | None:
    """B: given, or the mean total traffic of the runs of scenario `budget_from`."""
    if budget_gib is not None or budget_from is None:
        return budget_gib
    spent = [r["gib_total"] for r in records if r["scenario"] == budget_from]
    if not spent:
        names = sorted({r["scenario"] for r in records})
        raise ScenarioError([f"--budget-from: no run of scenario {budget_from!r}; the runs are "
                             f"of: {', '.join(names)}"])
    return float(np.mean(spent))


def compare(run_dirs: Sequence[str | Path], budget_gib: float | None = None,
            budget_from: str | None = None) -> Comparison:
    """Tabulate finished runs (first with each run's own budget, then with the common B)."""
    records = [run_record(d, None) for d in run_dirs]
    budget = resolve_budget(records, budget_gib, budget_from)
    if budget is not None:
        records = [run_record(d, budget) for d in run_dirs]
    return Comparison(records, budget, to_markdown(records, budget))


def _pct(values: list[Any], scale: float = 100.0, digits: int = 2) -> str:
    vals = [float(v) * scale for v in values if v is not None and not
            (isinstance(v, float) and math.isnan(v))]
    if not vals:
        return "–"
    if len(vals) == 1:
        return f"{vals[0]:.{digits}f}"
    return f"{np.mean(vals):.{digits}f} ± {np.std(vals, ddof=1):.{digits}f}"


def to_markdown(records: list[dict[str, Any]], budget: float | None) -> str:
    """Mean ± sample std over the runs of each scenario name (normally one per seed), in the
    order first seen."""
    head = ("| scenario | runs | Final (%) | Best (%) | Acc@B (%) | Acc@B/2 (%) | tier F1 "
            "| drop Δ (pts) | worst sensor | GiB | personal (%) | rounds | best round "
            "| fall after best (pts) | s/round |")
    lines = [f"B = {budget:.4g} GiB" if budget is not None else "B not set",
             "Final: accuracy at the last evaluation; Best: the highest of any evaluation", "",
             head, "|" + "---|" * 15]
    for name in dict.fromkeys(r["scenario"] for r in records):
        rs = [r for r in records if r["scenario"] == name]
        def col(k: str, rs: list[dict[str, Any]] = rs) -> list[Any]:
            return [r.get(k) for r in rs]

        sensors = ", ".join(sorted({str(s) for s in col("worst_drop_sensor") if s}))
        lines.append(
            f"| {name} | {len(rs)} | {_pct(col('final'))} | {_pct(col('best'))} | "
            f"{_pct(col('acc_at_budget'))} | "
            f"{_pct(col('acc_at_half_budget'))} | {_pct(col('tier_f1'), 1.0, 3)} | "
            f"{_pct(col('worst_drop'))} | {sensors or '–'} | {_pct(col('gib_total'), 1.0, 3)} "
            f"| {_pct(col('final_personal_accuracy'))} "
            f"| {_pct(col('rounds_completed'), 1.0, 0)} | {_pct(col('best_round'), 1.0, 0)} "
            f"| {_pct(col('fall_after_best'))} | "
            f"{_pct(col('wall_seconds_per_round'), 1.0, 3)} |")
    return "\n".join(lines) + "\n"


def write_comparison(comp: Comparison, out: str | Path) -> tuple[Path, Path]:
    """`comparison.parquet` (one row per run), `comparison.md` and `accuracy_vs_gib.png` (the
    budget B and B/2 marked) under `out`."""
    from raymm.compare import plot_runs

    d = Path(out)
    d.mkdir(parents=True, exist_ok=True)
    table = pa.table({c: [r.get(c) for r in comp.runs] for c in COLUMNS})
    if comp.budget_gib is not None:
        table = table.append_column("budget_gib", pa.array([comp.budget_gib] * len(comp.runs)))
    atomic_write_table(d / "comparison.parquet", table)
    atomic_write_bytes(d / "comparison.md", comp.markdown.encode())
    plot_runs([Path(r["run_dir"]) for r in comp.runs], comp.budget_gib, d / "accuracy_vs_gib.png")
    return d / "comparison.parquet", d / "comparison.md"


def method_scenarios(path: str | Path, methods: Sequence[str],
                     overrides: Sequence[str] = ()) -> tuple[list[dict[str, Any]], list[str]]:
    """The scenario at `path` once per method (`raymm.variants.method_variant`: same data,
    devices, rounds, protocol and sync period; the method's own policies), each named
    `<name>_<method>` (the scenario's own method keeps its name), and notes on the methods
    skipped. `methods` is a list of preset names or ["all"] (`raymm.api.method_names`): with
    "all", a method that cannot run on this scenario (e.g. a chain of modalities on a fusion
    layer) is skipped with the reason; a method named explicitly must be valid."""
    from raymm.api import load_scenario, method_names, presets
    from raymm.config import apply_overrides, read_yaml
    from raymm.variants import method_variant

    every = list(methods) == ["all"]
    names = method_names() if every else list(methods)
    table = presets()
    unknown = [m for m in names if m not in table]
    if unknown:
        raise ScenarioError([f"--methods: unknown method(s) {', '.join(unknown)}; choose from: "
                             f"all, {', '.join(sorted(table))}"])
    base = apply_overrides(read_yaml(path), overrides)
    out, skipped, problems = [], [], []
    for m in names:
        try:
            raw = method_variant(base, m, table)
            if m != base.get("method"):
                raw["name"] = f"{base.get('name')}_{m}"
            load_scenario(raw)
        except ScenarioError as exc:
            if not every:
                problems += [f"{m}: {p}" for p in exc.problems]
            skipped.append(f"{m}: {'; '.join(exc.problems)}")
            continue
        out.append(raw)
    if problems or not out:
        raise ScenarioError(problems or skipped, str(path))
    return out, skipped


def run_sweep(scenarios: Sequence[str | Path], seeds: Sequence[int] = (),
              overrides: Sequence[str] = (), out: str | Path = "sweeps",
              executor: str | None = None, budget_gib: float | None = None,
              budget_from: str | None = None, progress: bool = False,
              methods: Sequence[str] | None = None, jobs: int = 1) -> Comparison:
    """Run every scenario for every seed (its own seed if `seeds` is empty) under `out/runs/`,
    `jobs` at a time (`raymm.sweep_exec`), then write the comparison table of the runs that
    finished under `out/`; the ones that failed are listed in the result's `failed`. With
    `methods` (names or ["all"]), every scenario runs under each method (`method_scenarios`).

    Every job is validated, and its run directory `out/runs/<name>-seed<seed>` checked, before
    the first run starts, so a typo in the last one does not cost the hours spent on the
    others. Running the same sweep again skips finished runs and continues interrupted ones
    from their checkpoints (`raymm.sweep_plan`).
    """
    from raymm.sweep_exec import run_jobs
    from raymm.sweep_plan import actions_of, plan_jobs

    if jobs < 1:
        raise RaymmError(f"sweep: --jobs must be at least 1, got {jobs}")
    planned = plan_jobs(scenarios, seeds, overrides, Path(out) / "runs", methods, executor)
    names = list(dict.fromkeys(job.scenario.name for job in planned))
    if budget_from is not None and budget_from not in names:   # not hours later, at the table
        raise ScenarioError([f"--budget-from: no job runs scenario {budget_from!r}; the "
                             f"sweep's scenarios are: {', '.join(names)}"])
    actions = actions_of(planned)
    todo, failed = _announce(planned, actions)
    ended = run_jobs(todo, jobs, progress, _Reporter(len(todo)))
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
