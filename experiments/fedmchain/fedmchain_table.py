"""FedMChain against its baselines and ablations on one scenario, under one protocol.

The protocol (docs/reproducing.md): every method runs the same scenario (data, partition,
model, optimizer), the same total rounds and the same sync period υ (`training.sync_every`,
via `raymm.app.variants.method_variant`: FedAvg, FedProx and SCAFFOLD average every υ rounds), on
every seed; `--per-round` adds the parameter-averaging baselines at υ = 1 as extra rows. Each
cell is mean ± std over seeds; Acc@B is every run's best evaluated accuracy while its traffic
stayed within B = FedMChain's mean total traffic.

    RAYMM_DATA=/path/to/data python experiments/fedmchain/fedmchain_table.py \\
        scenarios/fedmchain_avdigits_imbalanced.yaml --out runs/avdigits_imbalanced \\
        --seeds 0 1 2 --per-round [--set key=value ...] [--methods fedmchain fedavg ...]

Writes table.md and table.json (every run's summary) into --out as it goes; finished runs are
read back instead of run again, so an interrupted table continues where it stopped.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

import pandas as pd

import policies
from raymm.app.api import run
from raymm.app.build import load_scenario
from raymm.app.variants import method_variant, per_method_overrides
from raymm.config.schema import apply_overrides, read_yaml
from raymm.data import DATASETS, dataset_params
from raymm.server.metrics import acc_at_budget
from raymm.units import GIB

METHODS = ["fedmchain", "fedavg", "fedprox", "scaffold", "local", "fedmchain_wo_mcft",
           "fedmchain_wo_ssca", "fedmchain_wo_ra", "fedmchain_wo_rc", "fedmchain_wo_rarc",
           # the baselines, at the same υ (server optimizers and Harmony through
           # their periodic twins, FedProto's prototypes on the same sync windows)
           "harmony", "fedproto", "fedadam", "fedyogi", "fedadagrad"]
PER_ROUND = ["fedavg", "fedprox", "scaffold"]


def columns(sensors: tuple[str, ...], tiers: list[tuple[str, ...]]) -> list[tuple[str, str]]:
    """(column, summary key): ACC, ACC per unimodal tier, ACC_m, each modality alone, MIR."""
    cols = [("ACC", "final_accuracy")]
    cols += [(f"ACC_{t[0]}", f"final_acc_tier/{t[0]}") for t in tiers if len(t) == 1]
    cols += [("ACC_m", "final_acc_multimodal")]
    cols += [(f"{m} only", f"final_acc_sensor/{m}") for m in sensors]
    return cols + [("MIR", "final_mir")]


def _stat(values: list[float]) -> tuple[float, float]:
    vals = [v for v in values if v is not None]
    if not vals:
        return float("nan"), float("nan")
    return statistics.mean(vals), statistics.stdev(vals) if len(vals) > 1 else 0.0


def table_rows(results: dict[str, list[dict[str, Any]]], cols: list[tuple[str, str]],
               budget_gib: float | None) -> dict[str, dict[str, tuple[float, float]]]:
    """Per row label: column -> (mean, std) over seeds."""
    out = {}
    for label, runs in results.items():
        r = {name: _stat([s.get(key) for s in runs]) for name, key in cols}
        r["traffic MiB"] = _stat([(s["bytes_up"] + s["bytes_down"]) / 2**20 for s in runs])
        if budget_gib is not None:
            r["Acc@B"] = _stat([acc_at_budget(s["_rows"], budget_gib) for s in runs])
        r["s/round"] = _stat([s.get("wall_seconds_per_round") for s in runs])
        out[label] = r
    return out


#: columns shown as plain numbers: (format, with ± std); every other column is a share, in %
PLAIN = {"MIR": (".2f", True), "s/round": (".2f", True), "traffic MiB": (".1f", False)}


def markdown(rows: dict[str, dict[str, tuple[float, float]]],
             plain: dict[str, tuple[str, bool]] = PLAIN) -> str:
    names = list(next(iter(rows.values())))
    lines = ["| method | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for label, r in rows.items():
        cells = []
        for n in names:
            mean, sd = r[n]
            if n in plain:
                fmt, with_std = plain[n]
                cells.append(f"{mean:{fmt}} ± {sd:{fmt}}" if with_std else f"{mean:{fmt}}")
            else:
                cells.append(f"{100 * mean:.1f} ± {100 * sd:.1f}")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def run_once(raw: dict[str, Any], out: Path, executor: str = "serial") -> dict[str, Any]:
    """Run `raw` unless a finished run of the same name is in `out/runs`; its summary with the
    evaluated rows attached (accuracy, traffic and simulated time so far: for Acc@B and time
    to a target accuracy)."""
    done = sorted((out / "runs").glob(f"{raw['name']}-*/summary.json"))
    if done:
        run_dir = done[-1].parent
        summary = json.loads(done[-1].read_text())
    else:
        res = run(raw, out=out / "runs", executor=executor)
        run_dir, summary = res.run_dir, dict(res.summary)
    rows = pd.read_parquet(run_dir / "rounds.parquet")
    summary["_rows"] = rows[["accuracy", "bytes_total", "sim_seconds_total"]].dropna(
        subset=["accuracy"]).to_dict("records")
    summary["run_dir"] = str(run_dir)
    return summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("scenario", help="a scenario written for fedmchain")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--methods", nargs="+", default=METHODS)
    ap.add_argument("--per-round", action="store_true",
                    help="also run FedAvg, FedProx and SCAFFOLD at υ = 1")
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--set-for", dest="method_overrides", action="append", default=[],
                    metavar="METHOD:KEY=VALUE",
                    help="override for one method's runs only (repeatable), e.g. "
                         "fedmultimodal:model.fusion=attention for a method defined on a "
                         "fusion layer, which the scenario's late fusion lacks; such runs are "
                         "named <scenario>_<method>_<key><value>")
    ap.add_argument("--table-name", default="table",
                    help="write <name>.md and <name>.json (default table): a run of some "
                         "methods into a shared --out need not overwrite the full table")
    args = ap.parse_args()
    base = apply_overrides(read_yaml(args.scenario), args.overrides)
    sc = load_scenario(base)
    every = sc.training.sync_every
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    jobs = [(m, m, None) for m in args.methods]
    if args.per_round and every > 1:
        jobs += [(f"{m} (υ=1)", m, 1) for m in PER_ROUND if m in args.methods]
    own = per_method_overrides(args.method_overrides)
    results: dict[str, list[dict[str, Any]]] = {}
    for seed in args.seeds:
        for label, method, sync in jobs:
            raw = method_variant(base, method, policies.PRESETS, sync_every=sync)
            tag = "".join(f"_{k.rsplit('.', 1)[-1]}{v}" for k, v in
                          (o.split("=", 1) for o in own.get(method, [])))
            raw = apply_overrides(raw, own.get(method, []))
            raw.update(seed=seed,
                       name=f"{sc.name}_{method}{tag}{'_u1' if sync else ''}_s{seed}")
            summary = run_once(raw, out)
            results.setdefault(label, []).append(summary)
            print(f"{label} seed {seed}: ACC {summary['final_accuracy']:.4f}", flush=True)
    tiers = [tuple(t.sensors) for t in sc.population.tiers or []]
    # the sensor order, without loading the data
    sensors = tuple(DATASETS[sc.dataset_name].sensors(
        dataset_params(sc.dataset_name, sc.dataset_params())))
    spent = [(s["bytes_up"] + s["bytes_down"]) / GIB for s in results.get("fedmchain", [])]
    budget = statistics.mean(spent) if spent else None
    rows = table_rows(results, columns(sensors, tiers), budget)
    header = (f"{sc.name}: {sc.rounds} rounds, υ = {every} for every method unless marked, "
              f"seeds {args.seeds}; Acc@B with B = {budget * 1024:.2f} MiB (FedMChain's mean "
              f"traffic)\n\n" if budget else "")
    text = header + markdown(rows)
    (out / f"{args.table_name}.md").write_text(text)
    (out / f"{args.table_name}.json").write_text(json.dumps(
        {"budget_gib": budget, "rows": rows,
         "runs": {k: [{kk: vv for kk, vv in s.items() if kk != "_rows"} for s in v]
                  for k, v in results.items()}}, indent=1))
    print(text)


if __name__ == "__main__":
    main()
