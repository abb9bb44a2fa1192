"""Experiment (a) of issue 32, synchronous half: FedAvg on HAR under the FLASH trace on the
seconds clock, with and without over-commitment and a deadline, 3 seeds each.

Writes results/clock_flash/<variant>_s<seed>/ (config.yaml, summary.json, rounds.parquet) and
results/clock_flash/table.md, table.csv (mean ± std over seeds, ddof 1). A finished run kept
there is not run again. `--smoke` runs 3 rounds of one seed into a temporary folder.

    RAYMM_DATA=... nice -n 19 python experiments/clock/clock_flash_table.py [--rounds 500]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

from raymm.results.tables import mean_std

REPO = Path(__file__).resolve().parents[2]
SCENARIO = REPO / "scenarios" / "clock_flash.yaml"
VARIANTS = {
    "all": [],
    "all_deadline60": ["faults.deadline_seconds=60"],
    "kth_oc0.3": ["clock.round_end=kth", "clock.overcommit=0.3"],
    "kth_oc0.3_deadline60": ["clock.round_end=kth", "clock.overcommit=0.3",
                              "faults.deadline_seconds=60"],
}
SEEDS = (42, 123, 2024)
KEEP = ("config.yaml", "summary.json", "rounds.parquet")
#: accuracy read at this simulated time (the last evaluation at or before it): the runs of one
#: rounds count end at different simulated times
AT_HOURS = 5.0
COLUMNS = ("final_accuracy", "best_accuracy", f"acc_at_{AT_HOURS:g}h", "sim_hours",
           "time_to_target_hours", "rounds_to_target", "gib_total", "wasted_work_share",
           "departed", "stragglers", "idle_hours", "mean_online")


def derived(s: dict, rounds_file: Path) -> dict:
    """Columns from the curve and the rows: accuracy at AT_HOURS, stragglers dropped."""
    curve = [a for h, a in s.get("accuracy_vs_sim_hours", []) if h <= AT_HOURS]
    out = {f"acc_at_{AT_HOURS:g}h": curve[-1] if curve else None}
    if rounds_file.is_file():
        # deferred: pandas only for the table
        import pandas as pd

        out["stragglers"] = int(pd.read_parquet(rounds_file)["stragglers"].sum())
    return out


def run_one(variant: str, seed: int, rounds: int, out: Path) -> dict:
    import raymm

    dest = out / f"{variant}_s{seed}"
    if (dest / "summary.json").is_file():
        return json.loads((dest / "summary.json").read_text())
    with tempfile.TemporaryDirectory() as tmp:
        res = raymm.run(str(SCENARIO), [*VARIANTS[variant], f"seed={seed}", f"rounds={rounds}",
                                        f"name={variant}_s{seed}"], out=tmp, progress=False)
        dest.mkdir(parents=True, exist_ok=True)
        for f in KEEP:
            shutil.copy(res.run_dir / f, dest / f)
    print(f"{variant} seed {seed}: final {res.summary['final_accuracy']:.4f}", file=sys.stderr)
    return res.summary


def fmt(values: list) -> str:
    return mean_std(values, count_missing=True)


def table(out: Path) -> str:
    lines = ["| variant | " + " | ".join(COLUMNS) + " |",
             "| --- |" + " --- |" * len(COLUMNS)]
    rows = []
    for variant in VARIANTS:
        sums = [{**json.loads(p.read_text()), **derived(json.loads(p.read_text()),
                                                          p.parent / "rounds.parquet")}
                for p in sorted(out.glob(f"{variant}_s*/summary.json"))]
        if not sums:
            continue
        lines.append(f"| {variant} (n={len(sums)}) | " + " | ".join(
            fmt([s.get(c) for s in sums]) for c in COLUMNS) + " |")
        rows += [{"variant": variant, "seed": s["seed"], **{c: s.get(c) for c in COLUMNS}}
                 for s in sums]
    # deferred: pandas only for the CSV
    import pandas as pd

    pd.DataFrame(rows).to_csv(out / "table.csv", index=False)
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=500)
    ap.add_argument("--out", type=Path, default=REPO / "results" / "clock_flash")
    ap.add_argument("--variants", nargs="*", choices=sorted(VARIANTS), default=list(VARIANTS))
    ap.add_argument("--seeds", nargs="*", type=int, default=list(SEEDS))
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--table-only", action="store_true", help="rebuild table.md/csv only")
    args = ap.parse_args()
    if args.smoke:
        with tempfile.TemporaryDirectory() as tmp:
            for v in args.variants:
                run_one(v, 42, 3, Path(tmp))
            print(table(Path(tmp)))
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    for seed in [] if args.table_only else args.seeds:
        for v in args.variants:
            run_one(v, seed, args.rounds, args.out)
    text = table(args.out)
    (args.out / "table.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
