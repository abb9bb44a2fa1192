"""Experiment (a) of issue 32, asynchronous half: FedBuff and FedAsync against synchronous
FedAvg on HAR under the FLASH trace (scenarios/clock_flash.yaml), each run for the same
simulated time and evaluated every 10 simulated minutes.

Writes results/async_flash/<method>_s<seed>/ (config.yaml, summary.json, rounds.parquet) and
results/async_flash/table.md, table.csv (mean ± std over seeds, ddof 1). A finished run kept
there is not run again. `--smoke` runs 20 simulated minutes of one seed into a temporary
folder.

    RAYMM_DATA=... nice -n 19 python experiments/async/async_flash_table.py [--hours 3] [--seeds 42]

Methods: `fedavg` (the synchronous round of clock_flash.yaml: K = 10, the round waits for all),
`fedbuff` (C = 10 in flight, a step every M = 5 arrivals, 1/sqrt(1+s), server lr 1),
`fedasync` (C = 10, alpha = 0.6, (1+s)^-0.5). Same devices, data, model and local training.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from raymm.results.tables import mean_std

REPO = Path(__file__).resolve().parents[2]
SCENARIO = REPO / "scenarios" / "clock_flash.yaml"
METHODS = {
    "fedavg": [],
    "fedbuff": ["method=fedbuff", "aggregation.concurrency=10", "aggregation.buffer=5"],
    "fedasync": ["method=fedasync", "aggregation.concurrency=10"],
}
SEEDS = (42, 123, 2024)
KEEP = ("config.yaml", "summary.json", "rounds.parquet")
COLUMNS = ("final_accuracy", "best_accuracy", "time_to_target_hours", "sim_hours",
           "rounds_completed", "gib_total", "wasted_work_share", "staleness_mean",
           "wall_seconds")


def run_one(method: str, seed: int, hours: float, out: Path) -> dict[str, Any]:
    # deferred: the table alone needs no torch
    import raymm

    dest = out / f"{method}_s{seed}"
    if (dest / "summary.json").is_file():
        return json.loads((dest / "summary.json").read_text())
    budget = hours * 3600.0

    def until_budget(row: dict[str, Any]) -> bool:
        return float(row["sim_seconds_total"]) >= budget

    sets = [*METHODS[method], f"seed={seed}", "rounds=100000", "eval.every=1000000",
            "clock.eval_every_seconds=600", "execution.executor=serial",
            f"name={method}_s{seed}"]
    with tempfile.TemporaryDirectory() as tmp:
        res = raymm.run(str(SCENARIO), sets, out=tmp, progress=False, on_round=until_budget)
        dest.mkdir(parents=True, exist_ok=True)
        for f in KEEP:
            shutil.copy(res.run_dir / f, dest / f)
    s = res.summary
    print(f"{method} seed {seed}: final {s['final_accuracy']}, to target "
          f"{s.get('time_to_target_hours')} h", file=sys.stderr)
    return s


def value(s: dict[str, Any], column: str) -> Any:
    if column == "staleness_mean":
        return s.get("async", {}).get("staleness_mean")
    return s.get(column)


def fmt(values: list[Any]) -> str:
    return mean_std(values, count_missing=True)


def table(out: Path) -> str:
    lines = ["| method | " + " | ".join(COLUMNS) + " |", "| --- |" + " --- |" * len(COLUMNS)]
    rows = []
    for method in METHODS:
        sums = [json.loads(p.read_text()) for p in sorted(out.glob(f"{method}_s*/summary.json"))]
        if not sums:
            continue
        lines.append(f"| {method} (n={len(sums)}) | " + " | ".join(
            fmt([value(s, c) for s in sums]) for c in COLUMNS) + " |")
        rows += [{"method": method, "seed": s["seed"], **{c: value(s, c) for c in COLUMNS}}
                 for s in sums]
    # deferred: pandas only for the CSV
    import pandas as pd

    pd.DataFrame(rows).to_csv(out / "table.csv", index=False)
    return "\n".join(lines) + "\n"


def from_rows(out: Path, targets: tuple[float, ...] = (0.6, 0.7)) -> str:
    """Hours and GiB to each target accuracy, and each method's accuracy at FedAvg's mean
    total traffic (the last evaluation within it), from the runs' rows."""
    # deferred: pandas only for the tables
    import pandas as pd

    gib = 1024 ** 3
    runs = {m: [pd.read_parquet(p) for p in sorted(out.glob(f"{m}_s*/rounds.parquet"))]
            for m in METHODS}
    runs = {m: dfs for m, dfs in runs.items() if dfs}
    if "fedavg" not in runs:
        return ""
    budget = float(np.mean([df["bytes_total"].iloc[-1] for df in runs["fedavg"]])) / gib
    head = [f"{what} to {t:.0%}" for t in targets for what in ("hours", "GiB")]
    lines = ["| method | " + " | ".join(head) + f" | accuracy at {budget:.3f} GiB |",
             "| --- |" + " --- |" * (len(head) + 1)]
    for m, dfs in runs.items():
        evals = [df[df["accuracy"].notna()] for df in dfs]
        cells = []
        for t in targets:
            hits = [ev[ev["accuracy"] >= t] for ev in evals]
            cells += [fmt([float(h["sim_seconds_total"].iloc[0]) / 3600 if len(h) else None
                           for h in hits]),
                      fmt([float(h["bytes_total"].iloc[0]) / gib if len(h) else None
                           for h in hits])]
        cells.append(fmt([float(ev[ev["bytes_total"] / gib <= budget]["accuracy"].iloc[-1])
                          for ev in evals]))
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hours", type=float, default=3.0, help="simulated hours per run")
    ap.add_argument("--out", type=Path, default=REPO / "results" / "async_flash")
    ap.add_argument("--methods", nargs="*", choices=sorted(METHODS), default=list(METHODS))
    ap.add_argument("--seeds", nargs="*", type=int, default=list(SEEDS))
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    if args.smoke:
        with tempfile.TemporaryDirectory() as tmp:
            for m in args.methods:
                run_one(m, 42, 1 / 3, Path(tmp))
            print(table(Path(tmp)))
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    for seed in args.seeds:
        for m in args.methods:
            run_one(m, seed, args.hours, args.out)
    text = table(args.out) + "\n" + from_rows(args.out)
    (args.out / "table.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
