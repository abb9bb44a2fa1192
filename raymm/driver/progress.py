"""What a run shows while it goes: the progress bar and one stderr line per round with faults.

Display only: nothing here changes a result, and with `progress=False` no bar is drawn.
"""

from __future__ import annotations

import sys
from typing import Any

from raymm.config.schema import Scenario
from raymm.population.faults import summary_line


def progress_bar(sc: Scenario, enabled: bool, done: int):  # noqa: ANN201 - tqdm or None
    """A tqdm bar over the scenario's rounds starting at `done` (a resumed run), or None."""
    if not enabled:
        return None
    # deferred: the bar is drawn only with progress on
    from tqdm import tqdm

    return tqdm(total=sc.rounds, initial=done, desc=sc.name, unit="round", dynamic_ncols=True)


def advance(bar: Any, rows: list[dict[str, Any]]) -> None:
    """One round done: move the bar and show the round, traffic and latest accuracy."""
    if bar is not None:
        bar.update(1)
        bar.set_postfix(postfix(rows), refresh=False)


def say_faults(row: dict[str, Any], bar: Any) -> None:
    """Injected or real faults of a round: one line on stderr (above the progress bar)."""

    line = summary_line(row)
    if line is None:
        return
    if bar is not None:
        bar.write(f"raymm: {line}", file=sys.stderr)
    else:
        print(f"raymm: {line}", file=sys.stderr, flush=True)


def postfix(rows: list[dict[str, Any]]) -> dict[str, str]:
    """The bar's suffix: last round, cumulative traffic, and the latest evaluated accuracy."""
    last = rows[-1]
    acc = next((r["accuracy"] for r in reversed(rows) if "accuracy" in r), None)
    out = {"round": str(last["round"]), "traffic": f"{last['bytes_total'] / 2**20:.1f}MiB"}
    if acc is not None:
        out["acc"] = f"{acc:.3f}"
    return out
