"""Accuracy against ε under user-level central DP (issue 33; docs/methods/privacy.md).

Runs every (method, ε, seed) of one base scenario with `privacy: {mode: central,
target_epsilon: ε, on_target: calibrate, adaptive_clip: true}` (σ solved before each run for
the run's releases and its sampling assumption), ε = inf being the non-private run, and writes
`table.md` / `table.csv` into --out (mean ± std over seeds, with each row's sampling assumption
and σ).

    # HAR: FedAvg and TIDE (prototypes and aux losses off: they would travel unnoised)
    RAYMM_DATA=... python scenarios/privacy_table.py scenarios/tide_har_fedavg.yaml \\
        --methods fedavg --out results/privacy_har --seeds 42 123 2024 --set rounds=300
    RAYMM_DATA=... python scenarios/privacy_table.py scenarios/tide_har.yaml \\
        --methods tide --out results/privacy_har --seeds 42 123 2024 --set rounds=300
    # the imbalanced audio-visual benchmark: FedAvg and the chain (SSCA reads every device's
    # delta, so the private chain merges with delta_mean: fedmchain_wo_ssca)
    RAYMM_DATA=... python scenarios/privacy_table.py scenarios/fedmchain_avdigits_imbalanced.yaml \\
        --methods fedavg fedmchain_wo_ssca --out results/privacy_avdigits --seeds 0 1 2

`--smoke` runs 2 rounds of one seed per row (a check that every row starts and reports ε).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

import policies
from raymm.app.api import run
from raymm.app.variants import method_variant
from raymm.config.schema import apply_overrides, read_yaml

EPSILONS = (1.0, 4.0, 8.0, math.inf)
#: method -> keys the private variant must set: nothing may travel besides the update
PRIVATE_KEYS: dict[str, dict[str, Any]] = {
    "tide": {"objective.lambda_p": 0.0, "objective.report_aux_loss": False},
}
METRICS = ("best_accuracy", "final_accuracy", "tier_f1", "worst_drop")


def variant(base: dict[str, Any], method: str, eps: float, seed: int, smoke: bool
            ) -> dict[str, Any]:
    raw = method_variant(base, method, policies.PRESETS) if base.get("method") != method \
        else dict(base)
    sets = [f"{k}={json.dumps(v)}" for k, v in PRIVATE_KEYS.get(method, {}).items()]
    if math.isfinite(eps):
        sets += ["privacy.mode=central", f"privacy.target_epsilon={eps}",
                 "privacy.on_target=calibrate", "privacy.adaptive_clip=true"]
    if smoke:
        sets += ["rounds=2", "eval.every=1", "output.tensorboard=false"]
    raw = apply_overrides(raw, sets)
    raw.update(seed=seed, name=f"{raw['name']}_{method}_eps{eps:g}_s{seed}")
    return raw


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("scenario")
    ap.add_argument("--methods", nargs="+", required=True)
    ap.add_argument("--epsilons", nargs="+", type=float, default=list(EPSILONS))
    ap.add_argument("--seeds", nargs="+", type=int, default=[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--executor", default="serial")
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    base = apply_overrides(read_yaml(args.scenario), args.overrides)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for method in args.methods:
        for eps in args.epsilons:
            runs = []
            for seed in args.seeds[:1] if args.smoke else args.seeds:
                res = run(variant(base, method, eps, seed, args.smoke), out=out / "runs",
                          executor=args.executor)
                runs.append(res.summary)
                p = res.summary.get("privacy", {})
                print(f"{method} ε={eps:g} seed {seed}: acc {res.summary['best_accuracy']} "
                      f"ε spent {p.get('epsilon', 'inf')} σ {p.get('noise_multiplier', 0)}",
                      flush=True)
            row: dict[str, Any] = {"method": method, "target_epsilon": eps, "runs": len(runs)}
            for m in METRICS:
                vals = [float(s[m]) for s in runs if s.get(m) is not None]
                row[m] = f"{np.mean(vals):.4f} ± {np.std(vals):.4f}" if vals else ""
            p = runs[-1].get("privacy", {})
            row["epsilon_spent"] = p.get("epsilon", math.inf)
            row["sigma"] = p.get("noise_multiplier", 0.0)
            row["assumption"] = p.get("assumption", "no privacy")
            rows.append(row)
    with open(out / "table.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    head = list(rows[0])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(str(r[k]) for k in head) + " |" for r in rows]
    (out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
