"""Accuracy against ε under user-level central DP (issue 33; docs/methods/privacy.md).

Runs every (method, ε, seed) of one base scenario with `privacy: {mode: central,
target_epsilon: ε, on_target: calibrate, adaptive_clip: true}` (σ solved before each run for
the run's releases and its sampling assumption), ε = inf being the non-private run at the same
rounds. Each finished run's small files (config.yaml, summary.json, rounds.parquet) are kept in
`--out/<method>_eps<ε>_s<seed>/` (the whole run directory stays under `--out/runs/`, which git
ignores); a run already kept there is not run again. Then, from every run kept in `--out` (also
those of earlier invocations with other methods or another base scenario), it writes
`table.md` / `table.csv` (mean ± std over seeds, ε spent, σ, and each row's sampling
assumption) and `accuracy_vs_epsilon.png`.

    # HAR: FedAvg and TIDE (prototypes and aux losses off: they would travel unnoised)
    RAYMM_DATA=... python experiments/privacy/privacy_table.py scenarios/tide_har_fedavg.yaml \\
        --methods fedavg --out results/privacy_har --seeds 42 123 2024 --set rounds=100
    RAYMM_DATA=... python experiments/privacy/privacy_table.py scenarios/tide_har.yaml \\
        --methods tide --out results/privacy_har --seeds 42 123 2024 --set rounds=100
    # the imbalanced audio-visual benchmark: FedAvg and the chain (SSCA reads every device's
    # delta, so the private chain merges with delta_mean: fedmchain_wo_ssca)
    RAYMM_DATA=... python experiments/privacy/privacy_table.py \\
        scenarios/fedmchain_avdigits_imbalanced.yaml --methods fedavg fedmchain_wo_ssca \\
        --out results/privacy_avdigits --seeds 0 1 2 --set rounds=100
    # only the table and the plot, from the runs kept in a folder
    python experiments/privacy/privacy_table.py --table-only --out results/privacy_har

`--smoke` runs 2 rounds of one seed per row (a check that every row starts and reports ε).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import re
import shutil
import statistics
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

import policies
from raymm.app.api import run
from raymm.app.variants import method_variant
from raymm.config.schema import apply_overrides, read_yaml
from raymm.driver.pictures import save_png

EPSILONS = (1.0, 4.0, 8.0, math.inf)
#: method -> keys the private variant must set: nothing may travel besides the update
PRIVATE_KEYS: dict[str, dict[str, Any]] = {
    "tide": {"objective.lambda_p": 0.0, "objective.report_aux_loss": False},
}
#: summary entries tabulated (mean ± std over seeds, in %), with their column names; a column
#: no run reports (tier F1 and the worst-case drop on the audio-visual benchmark) is left out
METRICS = {"best_accuracy": "best acc", "final_accuracy": "final acc",
           "tier_f1": "tier F1", "worst_drop": "worst-case drop"}
#: prefix of the per-sensor accuracies (one sensor present) tabulated after METRICS
SENSOR_ONLY = "best_acc_sensor/"
#: the small files a kept run holds (results/README.md)
KEPT = ("config.yaml", "summary.json", "rounds.parquet")
KEY = re.compile(r"(?P<method>.+)_eps(?P<eps>[0-9.]+|inf)_s(?P<seed>\d+)")


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


def key(method: str, eps: float, seed: int) -> str:
    return f"{method}_eps{eps:g}_s{seed}"


def finished(folder: Path, raw: dict[str, Any]) -> bool:
    """`folder` holds a finished run of the scenario `raw` (its name and its rounds)."""
    if not (folder / "summary.json").is_file() or not (folder / "config.yaml").is_file():
        return False
    conf = read_yaml(folder / "config.yaml")
    return conf.get("name") == raw["name"] and conf.get("rounds") == raw["rounds"]


def earlier(out: Path, raw: dict[str, Any]) -> Path | None:
    """The newest finished run directory of `raw` under `out/runs` (an interrupted or earlier
    invocation ran it), if any."""
    for d in sorted((out / "runs").glob(raw["name"] + "-*"), reverse=True):
        if finished(d, raw):
            return d
    return None


def keep(run_dir: Path, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name in KEPT:
        shutil.copy2(run_dir / name, folder / name)


def collect(out: Path) -> list[dict[str, Any]]:
    """Every kept run in `out`: method, ε, seed and its summary."""
    runs = []
    for f in sorted(out.glob("*/summary.json")):
        m = KEY.fullmatch(f.parent.name)
        if m is None:
            continue
        runs.append({"method": m["method"], "eps": float(m["eps"]), "seed": int(m["seed"]),
                     "summary": json.loads(f.read_text())})
    return runs


def _stats(vals: list[float]) -> tuple[float, float | None]:
    """(mean, std over seeds); no std from one seed."""
    return statistics.mean(vals), statistics.stdev(vals) if len(vals) > 1 else None


def rows_of(runs: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[str]]:
    """One row per (method, ε): metric -> (mean, std) over seeds, and the privacy columns.
    Methods in the order first seen, ε ascending (∞ last)."""
    sensors = sorted({k for r in runs for k in r["summary"] if k.startswith(SENSOR_ONLY)})
    metrics = [m for m in (*METRICS, *sensors)
               if any(r["summary"].get(m) is not None for r in runs)]
    methods = list(dict.fromkeys(r["method"] for r in runs))
    rows = []
    for method in methods:
        for eps in sorted({r["eps"] for r in runs if r["method"] == method}):
            group = [r for r in runs if r["method"] == method and r["eps"] == eps]
            row: dict[str, Any] = {"method": method, "target_epsilon": eps,
                                   "seeds": sorted(r["seed"] for r in group),
                                   "rounds": sorted({r["summary"]["rounds_completed"]
                                                     for r in group})}
            for m in metrics:
                vals = [float(r["summary"][m]) for r in group
                        if r["summary"].get(m) is not None]
                row[m] = _stats(vals) if vals else None
            ps = [r["summary"].get("privacy") or {} for r in group]
            p = ps[-1]
            row["epsilon_spent"] = max((q.get("epsilon", math.inf) for q in ps),
                                       default=math.inf)
            row["delta"] = p.get("delta")
            row["sigma"] = p.get("noise_multiplier", 0.0)
            row["releases"] = p.get("releases")
            row["compositions"] = max((q.get("compositions", 0) for q in ps), default=None)
            row["sampling_rate"] = p.get("sampling_rate")
            assumptions = sorted({q.get("assumption", "no privacy") for q in ps})
            row["assumption"] = " / ".join(assumptions)
            rows.append(row)
    return rows, metrics


def _name(m: str) -> str:
    return METRICS.get(m, m.replace(SENSOR_ONLY, "") + " only")


def _cell(stat: tuple[float, float | None] | None) -> str:
    if stat is None:
        return ""
    mean, std = stat
    return f"{100 * mean:.1f}" if std is None else f"{100 * mean:.1f} ± {100 * std:.1f}"


def write_table(rows: list[dict[str, Any]], metrics: list[str], out: Path) -> str:
    """table.csv (numbers) and table.md (mean ± std in %, the assumption on every row)."""
    head = ["method", "target ε", "seeds", "rounds", *[_name(m) for m in metrics],
            "ε spent", "δ", "σ", "releases", "B", "q", "sampling assumption"]
    flat = []
    for r in rows:
        cells = [r["method"], f"{r['target_epsilon']:g}", " ".join(map(str, r["seeds"])),
                 "/".join(map(str, r["rounds"]))]
        cells += [_cell(r[m]) for m in metrics]
        priv = r["sigma"] > 0
        cells += [f"{r['epsilon_spent']:.3f}" if priv else "∞",
                  f"{r['delta']:.2e}" if priv else "", f"{r['sigma']:.3f}" if priv else "0",
                  str(r["releases"]) if priv else "", str(r["compositions"]) if priv else "",
                  f"{r['sampling_rate']:.3g}" if priv else "", r["assumption"]]
        flat.append(cells)
    with open(out / "table.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["method", "target_epsilon", "seeds", "rounds",
                    *[c for m in metrics for c in (m, m + "_std")], "epsilon_spent", "delta",
                    "sigma", "releases", "compositions", "sampling_rate", "assumption"])
        for r in rows:
            w.writerow([r["method"], r["target_epsilon"], " ".join(map(str, r["seeds"])),
                        "/".join(map(str, r["rounds"])),
                        *[("" if v is None else v) for m in metrics
                          for v in (r[m] or ("", ""))],
                        r["epsilon_spent"], r["delta"], r["sigma"], r["releases"],
                        r["compositions"], r["sampling_rate"], r["assumption"]])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(c.replace("|", "/") for c in cells) + " |" for cells in flat]
    text = ("Metrics in %, mean ± std over seeds (the mean alone from one seed); ε spent "
            "at δ is the largest over the seeds (equal by construction: σ is calibrated to "
            "the target); B = releases one device can have taken part in (the accountant's "
            "composition count); q = the sampling rate of an amplified row (0: no "
            "amplification).\n\n"
            + "\n".join(lines) + "\n")
    (out / "table.md").write_text(text)
    return text


def plot(rows: list[dict[str, Any]], metrics: list[str], out: Path) -> Path:
    """accuracy_vs_epsilon.png: one panel per metric (best and final accuracy; tier F1 and the
    worst-case drop where reported), one line per method, ε on a log axis
    with the non-private run drawn at the right as ∞ (error bars: std over seeds)."""
    finite = sorted({r["target_epsilon"] for r in rows if math.isfinite(r["target_epsilon"])})
    at_inf = 2 * finite[-1] if finite else 1.0
    shown = [m for m in metrics if not m.startswith(SENSOR_ONLY)]
    fig = Figure(figsize=(4.6 * len(shown), 3.8))
    FigureCanvasAgg(fig)  # its own Agg canvas: no pyplot state (as raymm.driver.pictures)
    axes = fig.subplots(1, len(shown), squeeze=False, gridspec_kw={"wspace": 0.3})[0]
    for ax, m in zip(axes, shown):
        for method in dict.fromkeys(r["method"] for r in rows):
            pts = [(r["target_epsilon"] if math.isfinite(r["target_epsilon"]) else at_inf,
                    *r[m]) for r in rows if r["method"] == method and r[m] is not None]
            if not pts:
                continue
            x, y, e = zip(*sorted(pts))
            ax.errorbar(x, [100 * v for v in y], yerr=[100 * (v or 0.0) for v in e], marker="o",
                        capsize=3, label=method)
        ax.set_xscale("log")
        ticks = [*finite, at_inf]
        ax.set_xticks(ticks)
        ax.set_xticklabels([f"{t:g}" for t in finite] + ["∞ (no DP)"])
        ax.minorticks_off()
        ax.set_xlabel("target ε (user level)")
        ax.set_ylabel(f"{_name(m)} (%)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    seeds = sorted({s for r in rows for s in r["seeds"]})
    rounds = sorted({n for r in rows for n in r["rounds"]})
    fig.suptitle(f"{out.name}: {'/'.join(map(str, rounds))} rounds, seeds "
                 f"{', '.join(map(str, seeds))}, mean ± std", fontsize=9)
    path = out / "accuracy_vs_epsilon.png"
    save_png(fig, path)
    return path


def report(out: Path) -> None:
    runs = collect(out)
    if not runs:
        raise SystemExit(f"no kept runs in {out}")
    rows, metrics = rows_of(runs)
    print(write_table(rows, metrics, out))
    print(f"wrote {out / 'table.md'}, {out / 'table.csv'}, {plot(rows, metrics, out)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("scenario", nargs="?")
    ap.add_argument("--methods", nargs="+", default=[])
    ap.add_argument("--epsilons", nargs="+", type=float, default=list(EPSILONS))
    ap.add_argument("--seeds", nargs="+", type=int, default=[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--executor", default="serial")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--table-only", action="store_true",
                    help="only write the table and the plot from the runs kept in --out")
    args = ap.parse_args()
    out = Path(args.out)
    if args.table_only:
        report(out)
        return
    if args.scenario is None or not args.methods:
        ap.error("a scenario and --methods are needed (or --table-only)")
    base = apply_overrides(read_yaml(args.scenario), args.overrides)
    out.mkdir(parents=True, exist_ok=True)
    for method in args.methods:
        for eps in args.epsilons:
            for seed in args.seeds[:1] if args.smoke else args.seeds:
                raw = variant(base, method, eps, seed, args.smoke)
                folder = out / key(method, eps, seed)
                if finished(folder, raw):
                    print(f"{folder.name}: kept already", flush=True)
                    continue
                done = earlier(out, raw)
                if done is not None:
                    keep(done, folder)
                    print(f"{folder.name}: kept from {done}", flush=True)
                    continue
                res = run(raw, out=out / "runs", executor=args.executor)
                keep(res.run_dir, folder)
                p = res.summary.get("privacy", {})
                print(f"{method} ε={eps:g} seed {seed}: acc {res.summary['best_accuracy']} "
                      f"ε spent {p.get('epsilon', 'inf')} σ {p.get('noise_multiplier', 0)}",
                      flush=True)
    report(out)


if __name__ == "__main__":
    main()
