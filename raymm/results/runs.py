"""Finished runs as pandas tables, for notebooks: `raymm.load_runs(path)`.

    runs = raymm.load_runs("sweeps/har")        # a run directory, or any folder holding runs
    runs.summaries                              # one row per run: summary.json
    runs.rounds                                 # one row per (run, round): rounds.parquet
    runs.rounds.groupby("name")["accuracy"].max()

Both tables start with the columns that say which run a row belongs to (`RUN_COLUMNS`): the
run directory's name (`run`) and path (`run_dir`), and the scenario `name`, `seed` and
`method` from its summary. Only what a run directory holds as data is read (JSON and Parquet);
nothing is imported that needs torch or Ray.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa

from raymm.errors import RaymmError
from raymm.results.compare import run_dirs_under

#: the columns, first in both tables, that name the run a row belongs to
RUN_COLUMNS = ("run", "run_dir", "name", "seed", "method")


@dataclass(frozen=True)
class Runs:
    """What `load_runs` returns: two pandas DataFrames."""

    rounds: pd.DataFrame     # one row per (run, round): every column of rounds.parquet
    summaries: pd.DataFrame  # one row per run: every key of summary.json

    def __len__(self) -> int:
        return len(self.summaries)


def load_runs(path: str | Path | Sequence[str | Path]) -> Runs:
    """The rounds and summaries of every finished run in `path`: a run directory, a folder of
    them (a sweep's `runs/`, `results/`, an `--out` folder), or a list of such paths. Runs are
    found recursively and listed in path order. A path without any run is an error, and so is
    a damaged summary.json or rounds.parquet (the message names the file)."""
    paths = [path] if isinstance(path, (str, Path)) else list(path)
    dirs: list[Path] = []
    for p in paths:
        found = run_dirs_under(p)
        if not found:
            raise RaymmError(f"load_runs: no run directory (a folder with summary.json) in {p}")
        dirs += [d for d in found if d not in dirs]
    summaries, rounds = [], []
    for d in dirs:
        summary = _read_summary(d)
        ident = {"run": d.name, "run_dir": str(d), "name": summary.get("name"),
                 "seed": summary.get("seed"), "method": summary.get("method")}
        summaries.append({**ident, **{k: v for k, v in summary.items() if k not in ident}})
        table = _read_rounds(d)
        for i, (key, value) in enumerate(ident.items()):
            if key in table.columns:
                table = table.drop(columns=key)
            table.insert(i, key, value)
        rounds.append(table)
    frames = [t for t in rounds if len(t)] or rounds[:1]  # runs without rounds add no rows
    return Runs(rounds=pd.concat(frames, ignore_index=True, sort=False),
                summaries=pd.DataFrame(summaries))


def _read_summary(d: Path) -> dict[str, Any]:
    try:
        summary = json.loads((d / "summary.json").read_text())
    except (OSError, ValueError, RecursionError) as exc:
        raise RaymmError(f"load_runs: {d / 'summary.json'} is unreadable: {exc}") from None
    if not isinstance(summary, dict):
        raise RaymmError(f"load_runs: {d / 'summary.json'} is not a raymm summary")
    return summary


def _read_rounds(d: Path) -> pd.DataFrame:
    path = d / "rounds.parquet"
    if not path.is_file():  # a run stopped before its first round was logged
        return pd.DataFrame()
    try:
        return pd.read_parquet(path)
    except (OSError, ValueError, pa.ArrowException) as exc:
        raise RaymmError(f"load_runs: {path} is unreadable: {exc}") from None
