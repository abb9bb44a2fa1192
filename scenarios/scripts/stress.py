"""Stress runs: a scenario at thousands of devices; seconds per round, peak memory, and what an
idle device costs.

    python scenarios/scripts/stress.py scenarios/stress/devices_10k.yaml \\
        scenarios/stress/devices_100k.yaml --out runs/stress

For each scenario it prints (and writes to OUT/stress.json): devices, selected per round,
rounds, steady seconds per round (rounds 2.., evaluation rounds included), peak memory
(machine-wide `MemTotal - MemAvailable` above its value before the run, and the peak PSS of the
run's own process tree: the driver, Ray and every actor) and the bytes per idle device: its
population row (sensor mask, tier, clock, hardware, the slice of one shared index array) and the
server's observations of it (data size, compute-time history, selection history). Training
samples are shared data, reported apart.

With `--kept` it instead runs each scenario round by round and, after every round, reads what
devices keep between rounds (own parameters and bases, control variates, adapters: the
checkpointed host state) and the server's state (global and cluster models, optimizer state),
and prints their bytes next to the model's size -- the memory budget of a method at a model
size, e.g. ResNet-18 encoders:

    python scenarios/scripts/stress.py scenarios/fedmchain_avdigits_resnet.yaml --kept \
        --set rounds=4 --set population.devices=70
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from raymm.api import build_world, load_scenario, make_executor, run
from raymm.bench import MemorySampler, steady
from raymm.engine import run_round
from raymm.local import build_model
from raymm.observations import Observations


def idle_bytes(world) -> dict[str, float]:  # noqa: ANN001 - a raymm.engine.World
    pop = world.population
    obs = Observations.register(pop.sensor_mask, pop.tier)
    obs_bytes = sum(np.asarray(v).nbytes for v in obs.state_dict().values())
    data = sum(x.nbytes for x in world.dataset.train.x.values()) + world.dataset.train.y.nbytes
    return {"population_bytes_per_device": pop.nbytes() / pop.n,
            "observation_bytes_per_device": obs_bytes / pop.n,
            "bytes_per_idle_device": (pop.nbytes() + obs_bytes) / pop.n,
            "training_data_mb": data / 2**20}


def stress(path: str, overrides: list[str], executor: str | None, out: Path) -> dict:
    sc = load_scenario(path, overrides)
    t0 = time.perf_counter()
    world = build_world(sc)
    build_s = time.perf_counter() - t0
    idle = idle_bytes(world)
    del world  # the run builds its own; this one would only inflate the driver's memory
    with MemorySampler() as mem:
        res = run(sc, out=out, executor=executor)
    walls = [r["wall_seconds"] for r in res.rows]
    return {"scenario": sc.name, "devices": sc.population.devices, "k": sc.selection.k,
            "rounds": len(walls), "executor": res.summary["executor"],
            "vectorise": sc.training.vectorise, "steady_s_per_round": steady(walls),
            "round_seconds": [round(w, 3) for w in walls], "build_s": build_s,
            "peak_mb": mem.peak_mb, "tree_pss_mb": mem.tree_pss_mb,
            "final_accuracy": res.summary["final_accuracy"],
            "mean_online": res.summary["mean_online"], **idle}


def nbytes(value) -> int:  # noqa: ANN001 - arrays in nested dicts/lists (checkpoint states)
    if isinstance(value, np.ndarray):
        return value.nbytes
    if isinstance(value, dict):
        return sum(nbytes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(nbytes(v) for v in value)
    return 0


def kept_state(path: str, overrides: list[str], executor: str | None) -> dict:
    """What devices and the server hold after each round, in MiB (see the module docstring)."""
    sc = load_scenario(path, overrides)
    if executor is not None:
        sc = sc.model_copy(update={"execution": sc.execution.model_copy(
            update={"executor": executor})})
    world = build_world(sc)
    model_mb = sum(p.numel() * p.element_size() for p in
                   build_model(world.dataset, sc.model, sc.seed).parameters()) / 2**20
    ex = make_executor(sc)
    rounds = []
    with MemorySampler() as mem:
        ex.start(world)
        try:
            for t in range(1, sc.rounds + 1):
                t0 = time.perf_counter()
                run_round(ex, t, sc)
                wall = time.perf_counter() - t0
                per_device = [nbytes(v) for v in ex.host_states().values()]
                mem.sample_tree()
                rounds.append({"round": t, "seconds": wall, "devices_keeping": len(per_device),
                               "kept_mb": sum(per_device) / 2**20,
                               "max_device_mb": max(per_device, default=0) / 2**20,
                               "server_mb": nbytes(ex.server_state()) / 2**20,
                               "tree_pss_mb": mem.tree_pss_mb})
                print("  round {round}: {seconds:.1f} s, {devices_keeping} devices keep "
                      "{kept_mb:.0f} MiB (at most {max_device_mb:.1f} MiB each), server "
                      "{server_mb:.0f} MiB, process tree PSS {tree_pss_mb:.0f} MiB"
                      .format(**rounds[-1]), flush=True)
        finally:
            ex.shutdown()
    return {"scenario": sc.name, "devices": sc.population.devices, "model_mb": model_mb,
            "max_kept_mb_per_device": max(r["max_device_mb"] for r in rounds),
            "max_kept_mb": max(r["kept_mb"] for r in rounds),
            "max_server_mb": max(r["server_mb"] for r in rounds),
            "peak_mb": mem.peak_mb, "tree_pss_mb": mem.tree_pss_mb, "rounds": rounds}


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("scenarios", nargs="+")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--executor", choices=["ray", "serial"], default=None)
    p.add_argument("--out", type=Path, default=Path("runs/stress"))
    p.add_argument("--kept", action="store_true",
                   help="report what devices and the server keep after every round instead")
    args = p.parse_args(argv)
    rows = []
    for path in args.scenarios:
        if args.kept:
            rows.append(r := kept_state(path, args.overrides, args.executor))
            print(f"{r['scenario']}: model {r['model_mb']:.1f} MiB; devices keep at most "
                  f"{r['max_kept_mb_per_device']:.1f} MiB each, {r['max_kept_mb']:.0f} MiB "
                  f"together; server {r['max_server_mb']:.0f} MiB; process tree PSS peak "
                  f"{r['tree_pss_mb']:.0f} MiB", flush=True)
            continue
        rows.append(stress(path, args.overrides, args.executor, args.out))
        r = rows[-1]
        print(f"{r['scenario']}: {r['devices']} devices, K={r['k']}, {r['rounds']} rounds, "
              f"{r['steady_s_per_round']:.3f} s/round, peak {r['peak_mb']:.0f} MB "
              f"(process tree PSS {r['tree_pss_mb']:.0f} MB), "
              f"{r['bytes_per_idle_device']:.0f} B per idle device "
              f"({r['population_bytes_per_device']:.0f} population + "
              f"{r['observation_bytes_per_device']:.0f} observations), "
              f"accuracy {r['final_accuracy']}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "stress.json").write_text(json.dumps(rows, indent=1))
    return rows


if __name__ == "__main__":
    main()
