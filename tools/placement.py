"""Run a scenario on a Ray cluster and report where its DeviceActors ran.

A scenario script (plain Python, not a package): on the head node of a cluster started with
`ray up cluster.yaml`, or anywhere with `RAY_ADDRESS` / `--set execution.address=HOST:PORT`,

    python tools/placement.py scenarios/quickstart.yaml --set rounds=3

prints one line per round and finally `PLACEMENT {json}`: the actors per node, each actor's
node, GPU ids, torch device and device count, and the final accuracy.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter

from actors.ray_executor import RayExecutor
from raymm.app.build import build_world, load_scenario
from raymm.sim.engine import run_rounds


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("scenario")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    args = p.parse_args(argv)
    sc = load_scenario(args.scenario, [*args.overrides, "execution.executor=ray"])
    ex = RayExecutor(sc.execution)
    ex.start(build_world(sc))
    try:
        placements = ex.placements()
        rows: list[dict] = []
        run_rounds(ex, sc, 1, lambda rec: rows.append(rec.row) or print(
            f"round {rec.row['round']}: selected {rec.row['selected']}, "
            f"accuracy {rec.row.get('accuracy', '-')}", flush=True))
    finally:
        ex.shutdown()
    acc = [r["accuracy"] for r in rows if "accuracy" in r]
    out = {"nodes": len({p["node_id"] for p in placements}),
           "actors_per_node": dict(Counter(p["node_id"] for p in placements)),
           "actors": placements, "rounds": len(rows), "final_accuracy": acc[-1] if acc else None}
    print("PLACEMENT " + json.dumps(out), flush=True)
    return out


if __name__ == "__main__":
    main()
