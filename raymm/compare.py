"""`raymm compare`: one table of several runs' summaries and one accuracy-vs-traffic picture.

A path may be a run directory or a folder of run directories (a sweep's output).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from raymm.errors import RaymmError
from raymm.rundir import GIB

FIRST_COLUMNS = ["run", "method", "seed", "rounds_completed", "final_accuracy", "best_accuracy",
                 "gib_total", "wall_seconds_per_round"]


def find_runs(paths: Sequence[str | Path]) -> list[Path]:
    runs: list[Path] = []
    for p in map(Path, paths):
        if (p / "summary.json").is_file():
            runs.append(p)
        elif p.is_dir() and (found := sorted(q.parent for q in p.glob("*/summary.json"))):
            runs += found
        else:
            raise RaymmError(f"compare: {p} is neither a run directory (no summary.json) nor a "
                             "folder of run directories")
    return runs


def load_run(run: Path) -> tuple[dict[str, Any], pd.DataFrame, dict[str, Any]]:
    summary = json.loads((run / "summary.json").read_text())
    rounds = pd.read_parquet(run / "rounds.parquet")
    config = yaml.safe_load((run / "config.yaml").read_text()) if (run / "config.yaml").exists() \
        else {}
    return summary, rounds, config


def comparison_table(runs: Sequence[Path]) -> pd.DataFrame:
    rows = []
    for run in runs:
        summary, _, _ = load_run(run)
        row = {"run": run.name, **{k: v for k, v in summary.items()
                                   if isinstance(v, (int, float, str)) or v is None}}
        rows.append(row)
    df = pd.DataFrame(rows)
    first = [c for c in FIRST_COLUMNS if c in df.columns]
    return df[first + [c for c in df.columns if c not in first]]


def budget_of(runs: Sequence[Path], given: float | None) -> float | None:
    if given is not None:
        return given
    for run in runs:
        budget = (load_run(run)[2].get("eval") or {}).get("budget_gib")
        if budget:
            return float(budget)
    return None


def curves(runs: Sequence[Path]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    out = {}
    for run in runs:
        _, rounds, _ = load_run(run)
        ev = rounds[rounds["accuracy"].notna()] if "accuracy" in rounds else rounds.iloc[:0]
        out[run.name] = (ev["bytes_total"].to_numpy() / GIB, ev["accuracy"].to_numpy())
    return out


def to_markdown(df: pd.DataFrame) -> str:
    def fmt(v: Any) -> str:
        if isinstance(v, float):
            return "" if np.isnan(v) else f"{v:.4g}"
        return "" if v is None else str(v)

    cols = list(df.columns)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join(lines) + "\n"


def compare(paths: Sequence[str | Path], out: str | Path, budget: float | None = None
            ) -> tuple[pd.DataFrame, Path]:
    """Write comparison.md, comparison.parquet and accuracy_vs_gib.png into `out`."""
    from raymm import visuals

    runs = find_runs(paths)
    df = comparison_table(runs)
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    df.to_parquet(out_dir / "comparison.parquet")
    (out_dir / "comparison.md").write_text(to_markdown(df))
    png = out_dir / "accuracy_vs_gib.png"
    visuals.save_png(visuals.accuracy_vs_traffic(curves(runs), budget_of(runs, budget)), png)
    return df, png
