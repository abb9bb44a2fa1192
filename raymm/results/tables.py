"""Tables of finished runs side by side: one record per run directory (final and best
accuracy, Acc@B, tier F1, worst-case drop, traffic), as CSV, Parquet and Markdown.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from raymm.driver.rundir import atomic_write_bytes, atomic_write_table
from raymm.errors import RaymmError, ScenarioError
from raymm.results.compare import plot_runs
from raymm.server.metrics import acc_at_budget

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


def mean_std(values: list[Any], scale: float = 1.0, digits: int = 3,
             count_missing: bool = False) -> str:
    """Mean ± sample std of the values that exist (None and NaN left out), each × scale; one
    value alone, "–" for none. `count_missing`: when some are missing (a target a run never
    reached), the mean and "(k/n reached)" instead of a std over the survivors."""
    vals = [float(v) * scale for v in values if v is not None and not
            (isinstance(v, float) and math.isnan(v))]
    if not vals:
        return "–"
    if count_missing and len(vals) < len(values):
        return f"{np.mean(vals):.{digits}f} ({len(vals)}/{len(values)} reached)"
    if len(vals) == 1:
        return f"{vals[0]:.{digits}f}"
    return f"{np.mean(vals):.{digits}f} ± {np.std(vals, ddof=1):.{digits}f}"


def _pct(values: list[Any], scale: float = 100.0, digits: int = 2) -> str:
    return mean_std(values, scale, digits)


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

    d = Path(out)
    d.mkdir(parents=True, exist_ok=True)
    table = pa.table({c: [r.get(c) for r in comp.runs] for c in COLUMNS})
    if comp.budget_gib is not None:
        table = table.append_column("budget_gib", pa.array([comp.budget_gib] * len(comp.runs)))
    atomic_write_table(d / "comparison.parquet", table)
    atomic_write_bytes(d / "comparison.md", comp.markdown.encode())
    plot_runs([Path(r["run_dir"]) for r in comp.runs], comp.budget_gib, d / "accuracy_vs_gib.png")
    return d / "comparison.parquet", d / "comparison.md"
