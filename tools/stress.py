"""Stress runs: a scenario at thousands to a million devices; seconds per round, peak memory,
and what an idle device costs.

    python tools/stress.py tools/stress/devices_10k.yaml \
        tools/stress/devices_100k.yaml tools/stress/devices_1m.yaml \
        --executor serial --out runs/stress

Each scenario runs in a child process of its own (so each peak is its own), and the script
prints one table row per scenario (and writes all of them to OUT/stress.json):

  * s/round: steady seconds per round, the mean over rounds 2.. (round 1 carries start-up;
    evaluation rounds are included), as wall time and, on the serial executor, as the CPU time
    of the process (user + system) over the same rounds. On a shared machine other processes
    stretch the wall time; the CPU time is what the round itself costs.
  * peak memory: the child's peak resident set (max RSS; on Ray this is the driver only), the
    peak PSS of its process tree (driver, Ray, every actor; sampled), and machine-wide
    `MemTotal - MemAvailable` above its value before the run (other processes move this one).
  * bytes per idle device, by summing the per-device arrays (not by difference of two
    population sizes): after the run, the child builds the world again, starts a serial
    executor and plans round 1 (so caches a selector fills exist), and adds up the bytes of
    every array the simulator keeps per device: the population (sensor mask, tier, clock,
    hardware, cached sample counts), the data index (offsets, and the device's slice of the one
    shared index array), the server's observations (data size, compute-time window, selection
    window, counters, and the selector's caches), the server's bookkeeping (last download,
    frozen copies sent), the hosts (device ids, state devices keep between rounds) and the
    aggregator's per-device state. Divided by the number of devices; training samples are
    shared data, reported apart.

With `--kept` it instead runs each scenario round by round and, after every round, reads what
devices keep between rounds (own parameters and bases, control variates, adapters: the
checkpointed host state) and the server's state (global and cluster models, optimizer state),
and prints their bytes next to the model's size -- the memory budget of a method at a model
size, e.g. ResNet-18 encoders:

    python tools/stress.py scenarios/fedmchain_avdigits_resnet.yaml --kept \
        --set rounds=4 --set population.devices=70
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from raymm.app.api import run
from raymm.app.bench import MemorySampler, steady
from raymm.app.build import build_world, load_scenario, make_executor, with_executor
from raymm.models.build import build_model
from raymm.sim.engine import run_round
from raymm.sim.serial import SerialExecutor


def _arrays(obj: Any) -> list[np.ndarray]:
    """The numpy arrays among an object's attributes (dataclass fields, cached values)."""
    return [v for v in vars(obj).values() if isinstance(v, np.ndarray)]


def _per_device(arrays: list[np.ndarray], n: int) -> int:
    """Bytes of the arrays that have an axis of length n (one entry per device)."""
    return sum(int(a.nbytes) for a in arrays if n in a.shape)


def per_device_bytes(ex: SerialExecutor, n: int) -> dict[str, int]:
    """Bytes of every array the started serial executor `ex` keeps per device, by owner
    (see the module docstring). Arrays without an axis of length n (a model, a policy's
    window of weights) are not per device and not counted."""
    server, pop = ex.server, ex.hosts[0].pop
    index = {"data_offsets", "data_indices", "test_offsets", "test_indices"}
    index_bytes = sum(int(getattr(pop, f).nbytes) for f in index
                      if getattr(pop, f, None) is not None)
    agg = server.policies.aggregator.state_dict()
    return {
        "population": _per_device([v for k, v in vars(pop).items() if k not in index
                                   and isinstance(v, np.ndarray)], n),
        "data_index": index_bytes,
        "observations": _per_device(_arrays(server.obs), n),
        "server": _per_device([server.last_download, *server.frozen_sent.values()], n),
        "hosts": sum(int(h.ids.nbytes) + nbytes(h.state_dict()) for h in ex.hosts),
        "aggregator": _per_device([v for v in agg.values() if isinstance(v, np.ndarray)], n),
    }


def bytes_per_idle_device(parts: dict[str, int], n: int) -> float:
    """The figure: all per-device bytes over the number of devices."""
    return sum(parts.values()) / n


def idle_cost(path: str, overrides: list[str]) -> dict[str, Any]:
    """Build the scenario's world, start a serial executor, plan round 1, and add up."""
    sc = load_scenario(path, overrides)
    world = build_world(sc)
    ex = SerialExecutor()
    ex.start(world)
    ex.plan(1, ex.poll(1))  # a selector's caches (TIDE's mean compute times) now exist
    parts = per_device_bytes(ex, world.population.n)
    n = world.population.n
    data = sum(x.nbytes for x in world.dataset.train.x.values()) + world.dataset.train.y.nbytes
    return {"bytes_per_idle_device": bytes_per_idle_device(parts, n),
            **{f"{k}_bytes_per_device": v / n for k, v in parts.items()},
            "training_data_mb": data / 2**20}


def stress(path: str, overrides: list[str], executor: str | None, out: Path) -> dict:
    """One scenario in this process: the run, its timings and peaks, then the idle cost."""
    sc = load_scenario(path, overrides)
    cpu: list[float] = [time.process_time()]

    def tick(row: dict[str, Any]) -> None:  # CPU time at the end of every round
        cpu.append(time.process_time())

    with MemorySampler() as mem:
        res = run(sc, out=out, executor=executor, on_round=tick)
    max_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10
    walls = [r["wall_seconds"] for r in res.rows]
    serial = res.summary["executor"] == "serial"
    return {"scenario": sc.name, "devices": sc.population.devices, "k": sc.selection.k,
            "rounds": len(walls), "executor": res.summary["executor"],
            "training_path": sc.execution.training.path, "steady_s_per_round": steady(walls),
            # CPU between the ends of rounds 1 and R (logging between rounds included)
            "steady_cpu_s_per_round": steady(list(np.diff(cpu))) if serial else None,
            "round_seconds": [round(w, 3) for w in walls],
            "max_rss_mb": max_rss_mb, "peak_mb": mem.peak_mb, "tree_pss_mb": mem.tree_pss_mb,
            "final_accuracy": res.summary["final_accuracy"],
            "mean_online": res.summary["mean_online"], **idle_cost(path, overrides)}


def in_child(path: str, overrides: list[str], executor: str | None, out: Path) -> dict:
    """`stress` in a fresh Python process, so its peak memory is its own."""
    cmd = [sys.executable, __file__, path, "--child", "--out", str(out)]
    cmd += [a for o in overrides for a in ("--set", o)]
    cmd += ["--executor", executor] if executor else []
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=True)
    line = next(x for x in proc.stdout.splitlines() if x.startswith("STRESS "))
    return json.loads(line[len("STRESS "):])


def _cpu(r: dict) -> str:
    cpu = r["steady_cpu_s_per_round"]
    return "-" if cpu is None else f"{cpu:.3f}"


def table(rows: list[dict]) -> str:
    head = (f"{'scenario':<16} {'devices':>9} {'K':>6} {'s/round':>8} {'CPU s/round':>11} "
            f"{'max RSS MB':>10} {'tree PSS MB':>11} {'B/idle device':>13}")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['scenario']:<16} {r['devices']:>9,} {r['k']:>6,} "
                     f"{r['steady_s_per_round']:>8.3f} "
                     f"{_cpu(r):>11} "
                     f"{r['max_rss_mb']:>10.0f} {r['tree_pss_mb']:>11.0f} "
                     f"{r['bytes_per_idle_device']:>13.0f}")
    lines.append("s/round: steady (rounds 2..) wall; CPU s/round: the process's user + system "
                 "time (serial executor); B/idle device: sum of the per-device arrays / devices")
    return "\n".join(lines)


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
    sc = with_executor(sc, executor)
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
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:  # one scenario, in the process `in_child` started
        r = stress(args.scenarios[0], args.overrides, args.executor, args.out)
        print("STRESS " + json.dumps(r), flush=True)
        return [r]
    rows = []
    for path in args.scenarios:
        if args.kept:
            rows.append(r := kept_state(path, args.overrides, args.executor))
            print(f"{r['scenario']}: model {r['model_mb']:.1f} MiB; devices keep at most "
                  f"{r['max_kept_mb_per_device']:.1f} MiB each, {r['max_kept_mb']:.0f} MiB "
                  f"together; server {r['max_server_mb']:.0f} MiB; process tree PSS peak "
                  f"{r['tree_pss_mb']:.0f} MiB", flush=True)
            continue
        rows.append(r := in_child(path, args.overrides, args.executor, args.out))
        parts = ", ".join(f"{r[k]:.0f} {k.removesuffix('_bytes_per_device')}" for k in r
                          if k.endswith("_bytes_per_device"))
        print(f"{r['scenario']}: {r['devices']} devices, K={r['k']}, {r['rounds']} rounds, "
              f"{r['steady_s_per_round']:.3f} s/round (CPU {_cpu(r)}), "
              f"max RSS {r['max_rss_mb']:.0f} MB (process tree PSS {r['tree_pss_mb']:.0f} MB), "
              f"{r['bytes_per_idle_device']:.0f} B per idle device ({parts}), "
              f"accuracy {r['final_accuracy']}", flush=True)
    if rows and not args.kept:
        print(table(rows))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "stress.json").write_text(json.dumps(rows, indent=1))
    return rows


if __name__ == "__main__":
    main()
