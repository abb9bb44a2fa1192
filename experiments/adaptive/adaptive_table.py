"""The adaptive methods' comparisons over seeds (mean ± std), with their targets checked:
every fixed chain order against the adaptive order, and TIDE's fixed score weights against
adaptive ones.

    # every fixed order of the scenario's modalities, and order: adaptive (rule gain)
    RAYMM_DATA=/path/to/data python experiments/adaptive/adaptive_table.py order \\
        scenarios/fedmchain_avdigits_imbalanced.yaml --out runs/adaptive/avdigits_imbalanced \\
        --seeds 0 1 2 [--rules gain weakest] [--set key=value ...]
    # fixed against adaptive weights; B = the fixed weights' mean traffic (as TIDE's paper)
    RAYMM_DATA=/path/to/data python experiments/adaptive/adaptive_table.py weights \\
        scenarios/tide_har.yaml --out runs/adaptive/tide_har --seeds 42 123 2024 \\
        --set rounds=300 [--rewards gib seconds] [--target 0.85]

The runs of each row differ from the scenario in that one setting only (`schedule.chain` /
`schedule.order`, or `selection.weights`). Writes table.md and table.json into --out as it
goes; finished runs found there are read back instead of run again. Docs:
docs/methods/adaptive.md.
"""

from __future__ import annotations

import argparse
import copy
import itertools
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

from policies.schedule.chain import ChainParams
from policies.schedule.order import ORDER_RULES
from raymm.app.build import load_scenario
from raymm.config.schema import apply_overrides, read_yaml
from raymm.data import dataset_sensors
from raymm.server.metrics import acc_at_budget
from raymm.units import GIB

# the fedmchain study's driver, in its folder beside this one
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fedmchain"))
from fedmchain_table import PLAIN, _stat, columns, markdown, run_once, table_rows  # noqa: E402


def with_section(raw: dict[str, Any], section: str, **values: Any) -> dict[str, Any]:
    """A copy of `raw` with keys of one section set (None removes a key)."""
    out = copy.deepcopy(raw)
    node = out.setdefault(section, {})
    for k, v in values.items():
        if v is None:
            node.pop(k, None)
        else:
            node[k] = v
    return out


def order_jobs(base: dict[str, Any], sensors: tuple[str, ...], rules: list[str],
               probe: int | None = None) -> list[tuple[str, str, dict[str, Any]]]:
    """(row label, run-name suffix, scenario) for every fixed order and every adaptive rule.
    With `probe` (the adaptive order's probe length), the ablation rows too: every fixed
    order after the same probe, and every rule without a probe."""
    perms = list(itertools.permutations(sensors))
    jobs = [(f"fixed {'→'.join(p)}", "-".join(p),
             with_section(base, "schedule", order="fixed", chain=list(p), probe_rounds=None))
            for p in perms]
    jobs += [(f"adaptive ({r})", f"adaptive-{r}",
              with_section(base, "schedule", order="adaptive", rule=r, chain=None, rounds=None))
             for r in rules]
    if probe:
        jobs += [(f"probe + fixed {'→'.join(p)}", f"probe-{'-'.join(p)}",
                  with_section(base, "schedule", order="fixed", chain=list(p),
                               probe_rounds=probe, rounds=None)) for p in perms]
        jobs += [(f"adaptive ({r}, no probe)", f"adaptive-{r}-noprobe",
                  with_section(base, "schedule", order="adaptive", rule=r, chain=None,
                               rounds=None, probe_rounds=0)) for r in rules]
    return jobs


def weight_jobs(base: dict[str, Any], rewards: list[str]) -> list[tuple[str, str, dict]]:
    jobs = [("fixed weights", "fixed", with_section(base, "selection", weights="fixed",
                                                    reward=None, arms=None))]
    jobs += [(f"adaptive ({r})", f"adaptive-{r}",
              with_section(base, "selection", weights="adaptive", reward=r)) for r in rewards]
    return jobs


def run_all(jobs: list[tuple[str, str, dict]], name: str, seeds: list[int], out: Path,
            executor: str) -> dict[str, list[dict[str, Any]]]:
    results: dict[str, list[dict[str, Any]]] = {}
    for seed in seeds:
        for label, suffix, raw in jobs:
            raw = dict(raw, seed=seed, name=f"{name}_{suffix}_s{seed}")
            summary = run_once(raw, out, executor)
            results.setdefault(label, []).append(summary)
            print(f"{label} seed {seed}: final {summary['final_accuracy']:.4f}", flush=True)
    return results


def seconds_to(rows: list[dict[str, Any]], target: float) -> float:
    """Simulated seconds until an evaluation first reached `target` (inf if none did)."""
    return next((r["sim_seconds_total"] for r in rows if r["accuracy"] >= target), math.inf)


def mean(values: list[float]) -> float:
    vals = [v for v in values if v is not None and v == v]
    return statistics.mean(vals) if vals else float("nan")


def order_verdict(rows: dict[str, dict[str, tuple[float, float]]]) -> list[str]:
    """The target: adaptive ACC ≥ the best fixed order's and > the worst's, MIR no worse than
    the best fixed order's. With the ablation rows, the adaptive order (with its probe) is
    also held against the fixed orders after the same probe."""
    lines = []
    for prefix, probed_only in (("fixed", False), ("probe + fixed", True)):
        fixed = {k: v for k, v in rows.items() if k.startswith(prefix)}
        if fixed:
            lines += _verdict(rows, fixed, probed_only)
    return lines


def _verdict(rows: dict[str, dict[str, tuple[float, float]]],
             fixed: dict[str, dict[str, tuple[float, float]]], probed_only: bool) -> list[str]:
    best = max(fixed, key=lambda k: fixed[k]["ACC"][0])
    worst = min(fixed, key=lambda k: fixed[k]["ACC"][0])
    lines = []
    for label, r in rows.items():
        if label.startswith("adaptive") and not (probed_only and "no probe" in label):
            acc, mir = r["ACC"][0], r["MIR"][0]
            lines.append(
                f"- {label}: ACC {100 * acc:.1f} vs best fixed {100 * fixed[best]['ACC'][0]:.1f}"
                f" ({best}) → {'met' if acc >= fixed[best]['ACC'][0] else 'MISSED'}; vs worst "
                f"{100 * fixed[worst]['ACC'][0]:.1f} ({worst}) → "
                f"{'met' if acc > fixed[worst]['ACC'][0] else 'MISSED'}; MIR {mir:.2f} vs "
                f"{fixed[best]['MIR'][0]:.2f} → "
                f"{'met' if mir <= fixed[best]['MIR'][0] else 'MISSED'}")
    return lines


def weight_rows(results: dict[str, list[dict[str, Any]]], target: float
                ) -> tuple[dict[str, dict[str, tuple[float, float]]], float]:
    budget = mean([(s["bytes_up"] + s["bytes_down"]) / GIB for s in results["fixed weights"]])
    rows = {}
    for label, runs in results.items():
        to_target = [seconds_to(s["_rows"], target) for s in runs]
        rows[label] = {
            "Final": _stat([s["best_accuracy"] for s in runs]),
            "Acc@B": _stat([acc_at_budget(s["_rows"], budget) for s in runs]),
            "Acc@B/2": _stat([acc_at_budget(s["_rows"], budget / 2) for s in runs]),
            "last": _stat([s["final_accuracy"] for s in runs]),
            "GiB": _stat([(s["bytes_up"] + s["bytes_down"]) / GIB for s in runs]),
            "sim s": _stat([s["sim_seconds"] for s in runs]),
            "s to target": _stat([t for t in to_target if math.isfinite(t)]),
            "missed target": (float(sum(not math.isfinite(t) for t in to_target)), 0.0),
        }
    return rows, budget


def weight_verdict(rows: dict[str, dict[str, tuple[float, float]]]) -> list[str]:
    """The target: adaptive ≥ fixed in Acc@B and Final, and no slower to the target."""
    f = rows["fixed weights"]
    lines = []
    for label, r in rows.items():
        if label.startswith("adaptive"):
            checks = [(k, r[k][0] >= f[k][0]) for k in ("Acc@B", "Final")]
            faster = r["missed target"][0] <= f["missed target"][0] and \
                r["s to target"][0] <= f["s to target"][0]
            lines.append(f"- {label}: " + ", ".join(
                f"{k} {100 * r[k][0]:.1f} vs {100 * f[k][0]:.1f} → {'met' if ok else 'MISSED'}"
                for k, ok in checks) + f"; seconds to target {r['s to target'][0]:.1f} vs "
                f"{f['s to target'][0]:.1f} → {'met' if faster else 'MISSED'}")
    return lines


def trajectories(results: dict[str, list[dict[str, Any]]], key: str) -> list[str]:
    """What each adaptive run chose: its phase order, or its arms and their rounds."""
    lines = []
    for label, runs in results.items():
        if not label.startswith("adaptive"):
            continue
        for s in runs:
            got = s.get(key)
            if key == "selection_weights":
                got = ", ".join(f"[{w['alpha']}, {w['beta']}, {w['gamma']}, "
                                f"{w['participation']}]×{w['rounds']}" for w in got or [])
            elif got is not None:
                got = " → ".join(got)
            lines.append(f"- {label}, seed {s['seed']}: {got}")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("kind", choices=["order", "weights"])
    ap.add_argument("scenario")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--rules", nargs="+", default=[ChainParams.model_fields["rule"].default],
                    choices=sorted(ORDER_RULES))
    ap.add_argument("--rewards", nargs="+", default=["gib"], choices=["gib", "seconds"])
    ap.add_argument("--target", type=float, default=None,
                    help="weights: accuracy to time (default: 95%% of the fixed weights' Final)")
    ap.add_argument("--probe-ablation", action="store_true",
                    help="order: also every fixed order after the same probe, and the "
                         "adaptive order without one (what the order adds beyond the probe)")
    ap.add_argument("--executor", default="serial", choices=["serial", "ray"])
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    args = ap.parse_args()
    base = apply_overrides(read_yaml(args.scenario), args.overrides)
    sc = load_scenario(base)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.kind == "order":
        sensors = dataset_sensors(sc.dataset_name, sc.dataset_params())
        probe = None
        if args.probe_ablation:
            given = (base.get("schedule") or {}).get("probe_rounds")
            probe = given if given is not None else 2 * sc.training.sync_every
        results = run_all(order_jobs(base, sensors, args.rules, probe), sc.name, args.seeds,
                          out, args.executor)
        tiers = [tuple(t.sensors) for t in sc.population.tiers or []]
        rows = table_rows(results, columns(sensors, tiers), None)
        notes = ["Targets:"] + order_verdict(rows) + ["", "Orders chosen:"] + \
            trajectories(results, "phase_order")
        text = markdown(rows)
    else:
        results = run_all(weight_jobs(base, args.rewards), sc.name, args.seeds, out,
                          args.executor)
        target = args.target if args.target is not None else \
            0.95 * mean([s["best_accuracy"] for s in results["fixed weights"]])
        rows, budget = weight_rows(results, target)
        plain = {**PLAIN, "GiB": (".3f", True), "sim s": (".1f", True),
                 "s to target": (".1f", True), "missed target": (".0f", False)}
        text = (f"B = {budget * 1024:.1f} MiB (the fixed weights' mean traffic); target "
                f"accuracy {100 * target:.1f}%\n\n" + markdown(rows, plain))
        notes = ["Targets:"] + weight_verdict(rows) + ["", "Weights chosen (arm × rounds):"] + \
            trajectories(results, "selection_weights")
    text = f"{sc.name}, seeds {args.seeds}\n\n{text}\n" + "\n".join(notes) + "\n"
    (out / "table.md").write_text(text)
    (out / "table.json").write_text(json.dumps(
        {"rows": rows, "runs": {k: [{kk: vv for kk, vv in s.items() if kk != "_rows"}
                                    for s in v] for k, v in results.items()}}, indent=1))
    print(text)


if __name__ == "__main__":
    main()
