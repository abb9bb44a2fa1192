"""One FedMChain-style table from every run under one or more table folders.

`experiments/fedmchain/fedmchain_table.py` writes one table per invocation. The baselines
study runs it several times into one folder (methods defined on a fusion layer with
`--set-for METHOD:model.fusion=attention`, the others as the scenario has them); this script
reads every finished run there and writes the whole table, one row per run name without its
seed, with Acc@B at B = FedMChain's mean total traffic, as the paper does.

    python experiments/baselines/av_table.py runs/av_baselines [more folders] --out DIR
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path
from typing import Any

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fedmchain"))
from fedmchain_table import columns, markdown, table_rows  # noqa: E402  (sibling script)

from raymm.units import GIB  # noqa: E402

SEED = re.compile(r"_s\d+$")


def finished_runs(folders: list[Path]) -> dict[str, list[dict[str, Any]]]:
    """Run label (the run's name without `_s<seed>` and the scenario's prefix) -> summaries, each
    with its evaluated rows attached (`_rows`, what Acc@B reads)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for folder in folders:
        for path in sorted(folder.glob("runs/*/summary.json")):
            summary = json.loads(path.read_text())
            rows = pd.read_parquet(path.parent / "rounds.parquet")
            summary["_rows"] = rows[["accuracy", "bytes_total", "sim_seconds_total"]].dropna(
                subset=["accuracy"]).to_dict("records")
            label = SEED.sub("", summary["name"]).split("imbalanced_", 1)[-1]
            out.setdefault(label, []).append(summary)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("folders", nargs="+", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--order", nargs="*", default=[],
                    help="row labels first, in this order (the rest follow by name)")
    args = ap.parse_args()
    runs = finished_runs(args.folders)
    if "fedmchain" not in runs:
        raise SystemExit("no fedmchain runs: B (FedMChain's mean traffic) is undefined")
    budget = statistics.mean((s["bytes_up"] + s["bytes_down"]) / GIB for s in runs["fedmchain"])
    order = [k for k in args.order if k in runs] + sorted(k for k in runs if k not in args.order)
    cols = columns(("audio", "visual"), [("audio",), ("visual",), ("audio", "visual")])
    rows = table_rows({k: runs[k] for k in order}, cols, budget)
    seeds = {k: sorted(s["seed"] for s in runs[k]) for k in order}
    text = (f"Acc@B with B = {budget * 1024:.2f} MiB (FedMChain's mean traffic); seeds per "
            f"row: {json.dumps(seeds)}\n\n" + markdown(rows))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "table.md").write_text(text)
    (args.out / "table.json").write_text(json.dumps(
        {"budget_gib": budget, "rows": rows,
         "runs": {k: [{kk: vv for kk, vv in s.items() if kk != "_rows"} for s in v]
                  for k, v in runs.items()}}, indent=1))
    print(text)


if __name__ == "__main__":
    main()
