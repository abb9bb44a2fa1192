"""Each DeviceActor's memory estimate against its measured proportional set size (PSS).

A scenario script: runs three sizes of a synthetic scenario on an embedded local Ray (two
DeviceActors), and after the last round reads every DeviceActor's PSS from
/proc/<pid>/smaps_rollup (Linux; shared pages, torch's libraries and the object store's rows,
are divided between the processes that map them) next to the estimate it asked Ray for
(`raymm.device.footprint`):

    python tools/actor_memory.py            # prints a table and MEMORY {json}

The sizes: `small` (the tiny model, 40 devices, 8,000 rows), `medium` (1,000 devices, 100,000
rows of 96 floats, params exchange), `large` (the same data, a wider model, delta exchange: every
device keeps its parameters and base, K = 500 over 4 rounds so nearly all of them have).
"""

from __future__ import annotations

import json
from pathlib import Path

from actors.ray_executor import RayExecutor
from raymm.app.build import build_world, load_scenario
from raymm.device.footprint import MIB
from raymm.sim.engine import run_rounds

DATA = {"name": "synthetic", "n_train": 100_000, "n_test": 500, "classes": 6,
        "sensors": {"a": {"dim": 64, "informativeness": 1.0},
                    "b": {"dim": 32, "informativeness": 0.5}}}
BASE = {"seed": 0, "method": "fedavg", "eval": {"every": 100},
        "execution": {"executor": "ray", "devices_per_actor": "auto", "local_num_cpus": 2,
                      "actor": {"num_cpus": 1, "max_restarts": 0}},
        "training": {"local_epochs": 1, "batch_size": 32, "lr": 0.05},
        "output": {"tensorboard": False}}
SIZES = {
    "small": {**BASE, "name": "small", "rounds": 3,
              "dataset": {**DATA, "n_train": 8_000}, "population": {"devices": 40},
              "model": {"embed_dim": 8, "hidden": 16, "fusion_dim": 16},
              "selection": {"name": "random", "k": 10}},
    "medium": {**BASE, "name": "medium", "rounds": 3, "dataset": DATA,
               "population": {"devices": 1000},
               "model": {"embed_dim": 64, "hidden": 128, "fusion_dim": 128},
               "selection": {"name": "random", "k": 100}},
    "large": {**BASE, "name": "large", "rounds": 4, "dataset": DATA,
              "population": {"devices": 1000},
              "model": {"embed_dim": 128, "hidden": 256, "fusion_dim": 256},
              "training": {**BASE["training"], "exchange": "delta", "sync_every": 5},
              "aggregation": {"name": "delta_mean"},
              "selection": {"name": "random", "k": 500}},
}


def pss(pid: int) -> int:
    """Bytes of the process's proportional set size."""
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no Pss in /proc/{pid}/smaps_rollup")


def measure(raw: dict) -> list[dict]:
    sc = load_scenario(raw)
    ex = RayExecutor(sc.execution)
    ex.start(build_world(sc))
    try:
        ex.ready()
        run_rounds(ex, sc, 1, lambda rec: None)
        out = []
        for place, ids in zip(ex.placements(), ex.blocks):
            n = int(ids.shape[0])
            fp = ex.memory.footprint
            out.append({"size": sc.name, "devices": n, "pss_mib": pss(place["pid"]) / MIB,
                        "estimate_mib": ex.memory(n) / MIB,
                        "parts_mib": {k: v / MIB for k, v in fp.parts(n).items()}
                        if fp is not None else {}})
        return out
    finally:
        ex.shutdown()


def main() -> list[dict]:
    rows = []
    for raw in SIZES.values():
        rows += measure(raw)
    print(f"{'size':8} {'devices':>7} {'estimate MiB':>12} {'PSS MiB':>8} {'est/PSS':>7}  parts")
    for r in rows:
        parts = ", ".join(f"{k} {v:.1f}" for k, v in r["parts_mib"].items())
        print(f"{r['size']:8} {r['devices']:7d} {r['estimate_mib']:12.1f} {r['pss_mib']:8.1f} "
              f"{r['estimate_mib'] / r['pss_mib']:7.2f}  {parts}")
    print("MEMORY " + json.dumps(rows))
    return rows


if __name__ == "__main__":
    main()
