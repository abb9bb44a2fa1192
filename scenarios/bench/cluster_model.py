"""Round time against cluster size: measure a simple model's constants here, then check it on a
real two-node Ray cluster on this machine. docs/cluster.md explains the model and its use.

    T(K, A) ~= a + b*K + c*K/A + transfer

K devices per round, A = nodes x DeviceActors per node. `a` is paid once per round (plan,
selection, a handful of Ray tasks), `b` per selected device outside the actors (the server
gathers and aggregates: it does not shrink with more nodes), `c` per selected device inside a
DeviceActor (local training), shared out among the actors. `transfer` is the broadcast to each
node and the updates back, bytes over bandwidth; on one machine it is a loopback copy.

It runs the standard bench workload (scenarios/bench/standard.yaml, `raymm bench`'s) for a few
rounds, taking the fastest round (of rounds 2..R, over --repeat runs):
  1. an embedded Ray with one DeviceActor at K, and at K/2  -> a and b + c;
  2. an embedded Ray with two DeviceActors at K             -> c (and so b);
  3. two Ray nodes (`ray start --head`, `ray start --address`, one CPU each, token auth, as in
     tests/integration/test_multinode.py), one DeviceActor per node, at K: the measured figure
     printed next to the model's prediction.
Then the model sized for a population of a million: DeviceActors needed for a target s/round.

    python scenarios/bench/cluster_model.py [--n 5000 --k 1000 --rounds 8 --repeat 1]

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
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from raymm.bench import run_raymm

RAY = str(Path(sys.executable).with_name("ray"))
NODE = ["--num-cpus=1", "--num-gpus=0", f"--memory={2 * 2**30}",
        f"--object-store-memory={300 * 2**20}", "--disable-usage-stats", "--block"]
PARAMS = 64 * 64 + 64 + 64 * 6 + 6  # standard.yaml's Linear(64,64)-ReLU-Linear(64,6)


def fit(t1: float, t_half: float, t2: float, k: int) -> dict[str, float]:
    """a, b, c from T(K,1), T(K/2,1), T(K,2) (three equations, three unknowns)."""
    b_plus_c = 2 * (t1 - t_half) / k
    c = 2 * (t1 - t2) / k
    return {"a": t1 - b_plus_c * k, "b": b_plus_c - c, "c": c}


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


def fastest_round(n: int, k: int, rounds: int, repeat: int, mode: str, out: Path,
                  extra: list[str]) -> float:
    """The fastest of rounds 2..R over `repeat` runs: outside load only ever slows a round
    down, so on a shared machine the fastest is the best estimate of an unloaded one."""
    runs = [run_raymm(n, k, rounds, 0, mode, "ray", out, extra)["round_seconds"][1:]
            for _ in range(repeat)]
    best = min(min(r) for r in runs)
    print(f"  K={k} {' '.join(extra)}: fastest {best:.4f} s/round (mean of each run: "
          f"{', '.join(f'{sum(r) / len(r):.4f}' for r in runs)})", flush=True)
    return best


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
    p.add_argument("--rounds", type=int, default=8, help="rounds per run (steady: 2..R)")
    p.add_argument("--repeat", type=int, default=1, help="runs per figure")
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

    def run(kk: int, extra: list[str]) -> float:
        return fastest_round(n, kk, args.rounds, args.repeat, mode, args.out, extra)

    t1 = run(k, ["execution.local_num_cpus=1"])
    t_half = run(k // 2, ["execution.local_num_cpus=1"])
    t2 = run(k, ["execution.local_num_cpus=2"])
    m = fit(t1, t_half, t2, k)
    print(f"model: a = {m['a'] * 1e3:.1f} ms/round, b = {m['b'] * 1e6:.1f} us/device, "
          f"c = {m['c'] * 1e6:.1f} us/device/actor", flush=True)
    with two_nodes(args.out) as address:
        t_nodes = run(k, [f"execution.address={address}"])
    xfer_loopback = 0.0  # one machine: the transfer is a memory copy, inside the measured a, b
    pred = predict(m, k, 2, xfer_loopback)
    print(f"two nodes x 1 DeviceActor, K={k}: model {pred:.4f} s/round, measured "
          f"{t_nodes:.4f} s/round ({(t_nodes - pred) / pred:+.0%})")

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
              f"{row['actors'] or 'out of reach (a + b*K alone exceeds it)'}")
    result = {"N": n, "K": k, "mode": mode, "rounds": args.rounds, "repeat": args.repeat,
              "load_avg": os.getloadavg(), "t_1actor": t1, "t_1actor_half_k": t_half,
              "t_2actors": t2, "model": m, "predicted_2nodes": pred,
              "measured_2nodes": t_nodes, "sizing": sizing}
    (args.out / "cluster_model.json").write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
