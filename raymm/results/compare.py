"""Finding run directories and drawing accuracy against cumulative traffic for several runs.

The comparison table itself lives in `raymm.app.sweep`; `raymm compare` and `raymm sweep` both
write it together with the picture drawn here.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from raymm.errors import RaymmError
from raymm.units import GIB


def run_dirs_under(path: str | Path) -> list[Path]:
    """`path` itself when it is a run directory (it holds summary.json), else every run
    directory below it at any depth, sorted by path; a run directory's own subfolders
    (checkpoints/) are not searched."""
    root = Path(path)
    if (root / "summary.json").is_file():
        return [root]
    found: list[Path] = []
    for here, subdirs, files in os.walk(root):
        if "summary.json" in files:
            found.append(Path(here))
            subdirs.clear()
    return sorted(found)


def find_runs(paths: Sequence[str | Path]) -> list[Path]:
    """Run directories (with summary.json) or folders holding them at any depth, e.g. a
    sweep's `runs/` or its `--out` folder."""
    runs: list[Path] = []
    for p in map(Path, paths):
        if found := run_dirs_under(p):
            runs += [r for r in found if r not in runs]
        else:
            raise RaymmError(f"compare: {p} is neither a run directory (no summary.json) nor a "
                             "folder of run directories")
    return runs


def curves(runs: Sequence[Path]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Run name -> (cumulative GiB, accuracy) at its evaluated rounds."""
    out = {}
    for run in runs:
        rounds = pd.read_parquet(run / "rounds.parquet")
        ev = rounds[rounds["accuracy"].notna()] if "accuracy" in rounds else rounds.iloc[:0]
        out[run.name] = (ev["bytes_total"].to_numpy() / GIB, ev["accuracy"].to_numpy())
    return out


def time_curves(runs: Sequence[Path]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Run name -> (simulated hours at the round's end, accuracy) at its evaluated rounds."""
    out = {}
    for run in runs:
        rounds = pd.read_parquet(run / "rounds.parquet")
        ev = rounds[rounds["accuracy"].notna()] if "accuracy" in rounds else rounds.iloc[:0]
        out[run.name] = (ev["sim_seconds_total"].to_numpy(np.float64) / 3600.0,
                         ev["accuracy"].to_numpy())
    return out


def plot_runs_time(runs: Sequence[Path], path: str | Path) -> Path:
    """Accuracy against simulated hours for `raymm compare --time-axis`."""
    # deferred: matplotlib loads only when a picture is drawn
    from raymm.driver import pictures

    pictures.save_png(pictures.accuracy_vs_sim_hours(time_curves(runs)), Path(path))
    return Path(path)


def plot_runs(runs: Sequence[Path], budget_gib: float | None, path: Path) -> Path:
    # deferred: matplotlib loads only when a picture is drawn
    from raymm.driver import pictures

    pictures.save_png(pictures.accuracy_vs_traffic(curves(runs), budget_gib), path)
    return path
