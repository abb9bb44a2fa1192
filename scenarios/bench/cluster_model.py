"""Round time against cluster size: measure a simple model's constants here, then check it on a
real two-node Ray cluster on this machine. docs/cluster.md explains the model and its use.

    T(K, A) ~= a + b*K + c*K/A + transfer

K devices per round, A = nodes x DeviceActors per node. `a` is paid once per round (plan,
selection, a handful of Ray tasks), `b` per selected device outside the actors (the server
gathers and aggregates: it does not shrink with more nodes), `c` per selected device inside a
DeviceActor (local training), shared out among the actors. `transfer` is the broadcast to each
node and the updates back, bytes over bandwidth; on one machine it is a loopback copy.

It runs the standard bench workload (scenarios/bench/standard.yaml, `raymm bench`'s) for a few
rounds on an embedded Ray with one DeviceActor, at K and at K/2, and after every round reads the
CPU time of the run's own processes (/proc: the DeviceActors, the ServerActor, the driver):
  * c = the DeviceActor's CPU seconds per round / K (a line through K and K/2: its intercept,
    actor-side work paid once per round, goes into a);
  * a + b*K = the round's wall time minus the DeviceActor's CPU time, the fastest round; K and
    K/2 give a and b.
CPU time, not the speed-up from one to two actors, because on a shared 2-core machine a second
actor does not get a second core (measured: two actors were slower than one at load 8-11).
Then two Ray nodes (`ray start --head`, `ray start --address`, one CPU each, token auth, as in
tests/integration/test_multinode.py) run the same at K with one DeviceActor per node: its
fastest round and its actors' CPU per device, next to the model's prediction. Last, the model
sized for a population of a million: DeviceActors needed for a target s/round.

    python scenarios/bench/cluster_model.py [--n 5000 --k 1000 --rounds 8]

Timings on a shared machine are loaded figures; the script prints the load average.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from raymm.bench import SCENARIO, settle

RAY = str(Path(sys.executable).with_name("ray"))
NODE = ["--num-cpus=1", "--num-gpus=0", f"--memory={2 * 2**30}",
        f"--object-store-memory={300 * 2**20}", "--disable-usage-stats", "--block"]
PARAMS = 64 * 64 + 64 + 64 * 6 + 6  # standard.yaml's Linear(64,64)-ReLU-Linear(64,6)


def fit(k: int, dev_cpu: tuple[float, float], rest: tuple[float, float]) -> dict[str, float]:
    """a, b, c from one DeviceActor at K and K/2: its CPU seconds per round (`dev_cpu`) and the
    rest of the round's wall time (`rest`), each as (at K, at K/2)."""
    c = 2 * (dev_cpu[0] - dev_cpu[1]) / k
    actor_fixed = dev_cpu[0] - c * k
    b = 2 * (rest[0] - rest[1]) / k
    return {"a": rest[0] - b * k + actor_fixed, "b": b, "c": c}


def predict(m: dict[str, float], k: int, actors: int, transfer: float = 0.0) -> float:
    return m["a"] + m["b"] * k + m["c"] * k / actors + transfer


def transfer_s(nodes: int, k: int, n: int, params: int, gbit_s: float) -> float:
    """Broadcast (float32 parameters) to each node, and the updates back: one float64 vector
    per 256-id block holding a selected device (raymm/combine.py), expected count for K
    uniform picks out of N."""
    blocks = math.ceil(n / 256)
    hit = blocks * (1 - (1 - min(1.0, 256 / n)) ** k)
    return (nodes * 4 * params + hit * 8 * params) * 8 / (gbit_s * 1e9)


def actors_needed(m: dict[str, float], k: int, target: float, transfer: float) -> float | None:
    """DeviceActors for a target s/round at K per round (None: a + b*K alone exceeds it)."""
    room = target - m["a"] - m["b"] * k - transfer
    return math.ceil(m["c"] * k / room) if room > 0 else None


def cpu_by_role(root: int) -> dict[str, float]:
    """CPU seconds (user + system) so far of `root`'s process tree, by role: the DeviceActors
    (Ray titles their processes `ray::DeviceActor`), everything else (driver, ServerActor,
    Ray's daemons)."""
    parent: dict[int, list[int]] = {}
    stats: dict[int, list[str]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid = int(stat.parent.name)
        parent.setdefault(int(fields[1]), []).append(pid)
        stats[pid] = fields
    tick = os.sysconf("SC_CLK_TCK")
    out = {"actors": 0.0, "rest": 0.0}
    todo = [root]
    while todo:
        pid = todo.pop()
        todo += parent.get(pid, [])
        try:
            title = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
        except OSError:
            continue
        cpu = (int(stats[pid][11]) + int(stats[pid][12])) / tick  # utime, stime
        out["actors" if title.startswith(b"ray::DeviceActor") else "rest"] += cpu
    return out


def measure(n: int, k: int, rounds: int, mode: str, out: Path,
            extra: list[str]) -> dict[str, float]:
    """Rounds 2..R of the standard workload: fastest wall, and per round the DeviceActors' CPU
    seconds and the wall time left beside them (medians; the fastest for the latter)."""
    from raymm.api import run

    overrides = [f"dataset.clients={n}", f"population.devices={n}", f"selection.k={k}",
                 f"rounds={rounds + 1}", "eval.every=1000000",
                 f"training.vectorise={'true' if mode == 'vectorised' else 'false'}", *extra]
    samples: list[dict[str, float]] = []
    walls: list[float] = []

    def between_rounds(row: dict[str, Any]) -> None:
        samples.append(cpu_by_role(os.getpid()))
        walls.append(row["wall_seconds"])

    settle()
    samples.append(cpu_by_role(os.getpid()))
    run(SCENARIO, overrides, out=out, executor="ray", on_round=between_rounds)
    dev = [b["actors"] - a["actors"] for a, b in zip(samples, samples[1:])][1:rounds]
    wall = walls[1:rounds]  # round 1 carries start-up, the last evaluates
    res = {"fastest": min(wall), "median": statistics.median(wall),
           "actor_cpu": statistics.median(dev),
           "rest": min(w - d for w, d in zip(wall, dev))}
    print(f"  K={k} {' '.join(extra)}: fastest round {res['fastest']:.4f} s (median "
          f"{res['median']:.4f}), DeviceActor CPU {res['actor_cpu']:.4f} s/round, the rest "
          f"{res['rest']:.4f} s", flush=True)
    return res


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def node_ports() -> list[str]:
    names = ["node-manager-port", "object-manager-port", "dashboard-agent-grpc-port",
             "dashboard-agent-listen-port", "metrics-export-port", "runtime-env-agent-port"]
    return [f"--{n}={free_port()}" for n in names]


@contextmanager
def two_nodes(log_dir: Path) -> Iterator[str]:
    """A head and a worker node of one CPU each on 127.0.0.1 with token auth; yields the
    address. Stopped by terminating the two `ray start --block` processes (never `ray stop`,
    which would stop every Ray on the machine)."""
    os.environ.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(16))
    port = free_port()
    temp = tempfile.mkdtemp(prefix="rmc", dir="/tmp")  # short: unix socket paths are limited
    procs: list[subprocess.Popen] = []

    def start(args: list[str], name: str) -> None:
        log = log_dir / f"{name}.log"
        proc = subprocess.Popen([RAY, "start", *args, *node_ports(), *NODE],
                                stdout=log.open("w"), stderr=subprocess.STDOUT,
                                start_new_session=True)
        procs.append(proc)
        deadline = time.monotonic() + 120
        while "block forever" not in log.read_text():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"ray start ({name}) failed:\n{log.read_text()[-3000:]}")
            time.sleep(0.5)

    try:
        start(["--head", "--node-ip-address=127.0.0.1", f"--port={port}",
               f"--ray-client-server-port={free_port()}", "--include-dashboard=false",
               f"--temp-dir={temp}"], "head")
        start([f"--address=127.0.0.1:{port}"], "worker")
        yield f"127.0.0.1:{port}"
    finally:
        for proc in reversed(procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
        shutil.rmtree(temp, ignore_errors=True)
        for key in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN"):
            os.environ.pop(key, None)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=5000, help="devices in the population")
    p.add_argument("--k", type=int, default=1000, help="devices per round (even)")
    p.add_argument("--rounds", type=int, default=8, help="rounds per run (2..R are measured)")
    p.add_argument("--mode", choices=["sequential", "vectorised"], default="sequential")
    p.add_argument("--gbit-s", type=float, default=10.0,
                   help="network bandwidth assumed for the transfer term on a real cluster")
    p.add_argument("--out", type=Path, default=Path("runs/cluster_model"))
    args = p.parse_args(argv)
    os.environ.setdefault("RAY_worker_niceness", "0")  # as `raymm bench`: compete on equal terms
    args.out.mkdir(parents=True, exist_ok=True)
    n, k, mode = args.n, args.k, args.mode
    print(f"standard workload, N={n}, {mode}, load average {os.getloadavg()[0]:.2f} "
          f"on {os.cpu_count()} CPUs", flush=True)
    one = measure(n, k, args.rounds, mode, args.out, ["execution.local_num_cpus=1"])
    half = measure(n, k // 2, args.rounds, mode, args.out, ["execution.local_num_cpus=1"])
    m = fit(k, (one["actor_cpu"], half["actor_cpu"]), (one["rest"], half["rest"]))
    print(f"model: a = {m['a'] * 1e3:.1f} ms/round, b = {m['b'] * 1e6:.1f} us/device, "
          f"c = {m['c'] * 1e6:.1f} us/device/actor", flush=True)
    with two_nodes(args.out) as address:
        nodes = measure(n, k, args.rounds, mode, args.out, [f"execution.address={address}"])
    pred = predict(m, k, 2)  # on one machine the transfer is a memory copy, inside a and b
    print(f"two nodes x 1 DeviceActor, K={k}: model {pred:.4f} s/round; measured fastest "
          f"round {nodes['fastest']:.4f} ({(nodes['fastest'] - pred) / pred:+.0%}), median "
          f"{nodes['median']:.4f}; DeviceActor CPU per device {nodes['actor_cpu'] / k * 1e6:.1f}"
          f" us (model c {m['c'] * 1e6:.1f})")

    sizing = []
    big_n = 1_000_000
    for kk in (1_000, 10_000, 100_000):
        xfer = transfer_s(32, kk, big_n, PARAMS, args.gbit_s)
        for target in (1.0, 10.0):
            sizing.append({"N": big_n, "K": kk, "target_s": target,
                           "transfer_s": round(xfer, 4),
                           "actors": actors_needed(m, kk, target, xfer)})
    print(f"N={big_n}: DeviceActors needed (transfer at {args.gbit_s:g} Gbit/s, 32 nodes):")
    for row in sizing:
        print(f"  K={row['K']:>7} target {row['target_s']:>4g} s/round: "
              f"{row['actors'] or 'out of reach (a + b*K alone exceeds it)'} "
              f"(transfer {row['transfer_s']:.3f} s)")
    result = {"N": n, "K": k, "mode": mode, "rounds": args.rounds,
              "load_avg": os.getloadavg(), "one_actor": one, "one_actor_half_k": half,
              "model": m, "predicted_2nodes": pred, "two_nodes": nodes, "sizing": sizing}
    (args.out / "cluster_model.json").write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
