"""Each method's round against FedAvg's on one scenario, rounds taken in turns.

    python tools/method_round_cost.py scenarios/tide_har.yaml --methods fedavg relief flism \
        --rounds 12 [--set KEY=VALUE] [--set-for METHOD:KEY=VALUE] [--out cost.json]

builds every method's variant of the scenario as a comparison table does
(`raymm.app.variants.method_scenarios`: same data, devices, protocol and sync period, the
method's own policies), starts one worker process per method (`tools/paired_rounds.Worker`)
and lets them run one round at a time, in turns, the order rotating every round: all methods
see the same machine within seconds, which keeps a ratio steadier on a shared machine than
medians taken minutes apart. Evaluation is off, so every round is a training round, on the
serial executor. It prints per method the median steady round (rounds 3..R), and the median
over rounds of the ratio to the first method's round of the same turn.

A method that selects its own devices (every online one, say) does more work a round than
FedAvg's K; `--set selection.name=random` gives every method FedAvg's selection, so the ratio
is the cost of the method's rules alone (a method whose policies need their own selection
then fails to validate and is reported).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from paired_rounds import Worker  # noqa: E402  (sibling tool)

from raymm.app.variants import method_scenarios, per_method_overrides  # noqa: E402
from raymm.config.schema import apply_overrides  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def turns(workers: dict[str, Worker], rounds: int) -> dict[str, list[float]]:
    """Every method's seconds per round, the methods taking each round in rotating order."""
    names = list(workers)
    walls: dict[str, list[float]] = {m: [] for m in names}
    for r in range(rounds):
        shift = r % len(names)
        for m in names[shift:] + names[:shift]:
            walls[m].append(float(workers[m].round()["wall"]))
        print(f"round {r + 1}: " + ", ".join(f"{m} {1e3 * walls[m][-1]:.0f} ms" for m in names),
              flush=True)
    return walls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("scenario", type=Path)
    ap.add_argument("--methods", nargs="+", required=True,
                    help="the first is the reference (FedAvg)")
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--set-for", dest="method_overrides", action="append", default=[])
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    if args.rounds < 4:
        raise SystemExit("--rounds: at least 4 (rounds 1-2 carry start-up)")
    variants, notes = method_scenarios(args.scenario, args.methods, args.overrides)
    for note in notes:
        print(f"note: {note}")
    own = per_method_overrides(args.method_overrides)
    steady = [f"rounds={args.rounds}", f"eval.every={args.rounds + 1}",
              "output.tensorboard=false", "output.checkpoint_every=0"]
    workers: dict[str, Worker] = {}
    with tempfile.TemporaryDirectory() as tmp:
        try:
            for m, raw in zip(args.methods, variants):
                path = Path(tmp) / f"{m}.yaml"
                path.write_text(yaml.safe_dump(apply_overrides(raw, own.get(m, []))))
                workers[m] = Worker(REPO, path, steady)
            walls = turns(workers, args.rounds)
        finally:
            for w in workers.values():
                w.stop()
    ref = args.methods[0]
    result: dict[str, Any] = {"scenario": str(args.scenario), "rounds": args.rounds,
                              "overrides": args.overrides, "methods": {}}
    print(f"\n| method | steady round (ms) | ratio to {ref} (median of paired rounds) |")
    print("|---|---|---|")
    for m in args.methods:
        ms = 1e3 * statistics.median(walls[m][2:])
        ratio = statistics.median(a / b for a, b in zip(walls[m][2:], walls[ref][2:]))
        result["methods"][m] = {"steady_ms": ms, "ratio": ratio, "walls": walls[m]}
        print(f"| {m} | {ms:.0f} | {ratio:.2f} |")
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
