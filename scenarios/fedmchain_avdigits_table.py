"""The FedMChain comparison table on the audio-visual digits benchmark.

Runs scenarios/fedmchain_avdigits.yaml once per method and seed with the serial executor (the
same data, partition, model and optimizer for every row; `raymm.variants.method_variant` drops
the fedmchain-only keys for the other methods) and writes table.md and table.json:

    RAYMM_DATA=/path/to/data PYTHONPATH=. python scenarios/fedmchain_avdigits_table.py \\
        --out runs/avdigits_table [--seeds 0 1] [--rounds 120] [--set key=value ...]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import policies
from raymm.api import run
from raymm.config import apply_overrides, read_yaml
from raymm.variants import method_variant

HERE = Path(__file__).parent
METHODS = ["fedmchain", "fedavg", "fedprox", "scaffold", "local", "fedmchain_wo_mcft",
           "fedmchain_wo_ssca", "fedmchain_wo_ra", "fedmchain_wo_rc", "fedmchain_wo_rarc"]
COLUMNS = [("ACC", "final_accuracy"), ("ACC_a", "final_acc_tier/audio"),
           ("ACC_v", "final_acc_tier/visual"), ("ACC_m", "final_acc_multimodal"),
           ("audio only", "final_acc_sensor/audio"), ("visual only", "final_acc_sensor/visual"),
           ("MIR", "final_mir")]


def row(summaries: list[dict[str, Any]]) -> dict[str, float]:
    """Means over seeds of the table's columns."""
    def mean(key: str) -> float:
        vals = [s[key] for s in summaries if s.get(key) is not None]
        return sum(vals) / len(vals) if vals else float("nan")

    out = {name: mean(key) for name, key in COLUMNS}
    out["traffic MiB"] = mean("bytes_up") / 2**20 + mean("bytes_down") / 2**20
    out["wall s/round"] = mean("wall_seconds_per_round")
    return out


def markdown(rows: dict[str, dict[str, float]]) -> str:
    names = list(next(iter(rows.values())))
    lines = ["| method | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for m, r in rows.items():
        cells = [f"{r[n]:.1f}" if n == "traffic MiB" else f"{r[n]:.2f}" if n in (
            "MIR", "wall s/round") else f"{100 * r[n]:.1f}" for n in names]
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="runs/avdigits_table")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--methods", nargs="+", default=METHODS)
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    args = ap.parse_args()
    base = apply_overrides(read_yaml(HERE / "fedmchain_avdigits.yaml"), args.overrides)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, list[dict[str, Any]]] = {}
    for method in args.methods:
        for seed in args.seeds:
            raw = method_variant(base, method, policies.PRESETS)
            raw.update(seed=seed, name=f"avdigits_{method}_s{seed}")
            if args.rounds:
                raw["rounds"] = args.rounds
            res = run(raw, out=out / "runs", executor="serial")
            results.setdefault(method, []).append({**res.summary, "run_dir": str(res.run_dir)})
            print(f"{method} seed {seed}: ACC {res.summary['final_accuracy']:.4f} "
                  f"({res.summary['wall_seconds']:.0f} s)", flush=True)
        rows = {m: row(s) for m, s in results.items()}
        (out / "table.json").write_text(json.dumps({"rows": rows, "runs": results}, indent=1))
        (out / "table.md").write_text(markdown(rows))
    print(markdown({m: row(s) for m, s in results.items()}))


if __name__ == "__main__":
    main()
