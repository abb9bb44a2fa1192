"""Round time against cluster size: measure a simple model's constants here, then check it on a
real two-node Ray cluster on this machine. docs/cluster.md explains the model and its use.

    T(N, K, A) ~= a + e*N + b*K + c*K/A + transfer

N devices in the population, K selected per round, A = nodes x DeviceActors per node. `a` is
paid once per round (Ray task round trips, planning, bookkeeping), `e` per population device
(availability and selection over everyone; counted as not shrinking with actors), `b` per
selected device outside the actors (the server gathers and aggregates: it does not shrink with
more nodes), `c` per selected device inside a DeviceActor (local training), shared out among
the actors. `transfer` is the broadcast
to each node and the updates back, bytes over bandwidth; on one machine it is a loopback copy.

It runs the standard bench workload (scenarios/bench/standard.yaml, `raymm bench`'s) for a few
rounds on an embedded Ray with one DeviceActor at K, K/2 and K=10, and after every round reads
the CPU time of the run's own processes from /proc, split into the DeviceActor and the rest
(driver, ServerActor, Ray's daemons). With medians over rounds 2..R:
  * c and b: the DeviceActor's and the rest's CPU seconds per round, slope from K/2 to K;
  * a: the fastest round at K=10, less (b + c) * 10 and less e*N;
  * e: the serial executor (all in one process) at K=10 with N and 4N devices, CPU per round.
CPU time, not the speed-up from one to two actors, because on a shared 2-core machine a second
actor gets no second core (measured: two actors were slower than one at load 8-11), and outside
load stretches wall time far more than CPU time. Then two Ray nodes (`ray start --head`,
`ray start --address`, one CPU each, token auth, as in tests/integration/test_multinode.py) run
K with one DeviceActor per node: its fastest and median round and its actors' CPU, next to the
model's prediction. Last, the model sized for a population of a million: DeviceActors needed
for a target s/round.

    python tools/cluster_model.py [--n 5000 --k 1000 --rounds 8]

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

from raymm.app.bench import SCENARIO, settle
from raymm.app.treemem import tree_pids

RAY = str(Path(sys.executable).with_name("ray"))
NODE = ["--num-cpus=1", "--num-gpus=0", f"--memory={2 * 2**30}",
        f"--object-store-memory={300 * 2**20}", "--disable-usage-stats", "--block"]
PARAMS = 64 * 64 + 64 + 64 * 6 + 6  # standard.yaml's Linear(64,64)-ReLU-Linear(64,6)


def fit(runs: list[dict[str, float]]) -> dict[str, float]:
    """a, b, c from three one-actor runs at K, K/2 and a small K: each with k, `actor_cpu` and
    `rest_cpu` (median CPU seconds per round) and `fastest` (the fastest round's wall)."""
    full, half, small = runs
    m = {"c": (full["actor_cpu"] - half["actor_cpu"]) / (full["k"] - half["k"]),
         "b": (full["rest_cpu"] - half["rest_cpu"]) / (full["k"] - half["k"])}
    m["a"] = small["fastest"] - (m["b"] + m["c"]) * small["k"]
    return m


def predict(m: dict[str, float], k: int, actors: int, transfer: float = 0.0,
            n: int = 0) -> float:
    """Seconds per round; `e` (per population device, counted as not shrinking with actors)
    enters with n."""
    return m["a"] + m.get("e", 0.0) * n + m["b"] * k + m["c"] * k / actors + transfer


def transfer_s(nodes: int, k: int, n: int, params: int, gbit_s: float) -> float:
    """Broadcast (float32 parameters) to each node, and the updates back: one float64 vector
    per 256-id block holding a selected device (raymm/protocol/combine.py), expected count for K
    uniform picks out of N."""
    blocks = math.ceil(n / 256)
    hit = blocks * (1 - (1 - min(1.0, 256 / n)) ** k)
    return (nodes * 4 * params + hit * 8 * params) * 8 / (gbit_s * 1e9)


def actors_needed(m: dict[str, float], k: int, target: float, transfer: float,
                  n: int = 0) -> int | None:
    """DeviceActors for a target s/round (None: what does not shrink with actors exceeds it)."""
    room = target - m["a"] - m.get("e", 0.0) * n - m["b"] * k - transfer
    return max(1, math.ceil(m["c"] * k / room)) if room > 0 else None


def cpu_by_role(root: int) -> dict[str, float]:
    """CPU seconds (user + system) so far of `root`'s process tree, by role: the DeviceActors
    (Ray titles their processes `ray::DeviceActor`), everything else (driver, ServerActor,
    Ray's daemons)."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {"actors": 0.0, "rest": 0.0}
    for pid in tree_pids(root):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            title = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
        except OSError:
            continue
        cpu = (int(fields[11]) + int(fields[12])) / tick  # utime, stime
        out["actors" if title.startswith(b"ray::DeviceActor") else "rest"] += cpu
    return out


def measure(n: int, k: int, rounds: int, mode: str, out: Path, extra: list[str],
            root: int | None = None) -> dict[str, float]:
    """Rounds 2..R of the standard workload: the fastest round's wall, the median one's, and
    the median CPU seconds per round of the DeviceActors and of the rest of `root`'s process
    tree (default: this process's)."""
    from raymm.app.api import run

    overrides = [f"dataset.clients={n}", f"population.devices={n}", f"selection.k={k}",
                 f"rounds={rounds + 1}", "eval.every=1000000",
                 f"execution.training.path={mode}", *extra]
    root = root or os.getpid()
    samples: list[dict[str, float]] = []
    walls: list[float] = []

    def between_rounds(row: dict[str, Any]) -> None:
        samples.append(cpu_by_role(root))
        walls.append(row["wall_seconds"])

    settle()
    samples.append(cpu_by_role(root))
    run(SCENARIO, overrides, out=out, executor="ray", on_round=between_rounds)
    steps = list(zip(samples, samples[1:]))[1:rounds]  # round 1 starts up, the last evaluates
    res = {"n": n, "k": k, "fastest": min(walls[1:rounds]),
           "median": statistics.median(walls[1:rounds]),
           "actor_cpu": statistics.median(b["actors"] - a["actors"] for a, b in steps),
           "rest_cpu": statistics.median(b["rest"] - a["rest"] for a, b in steps)}
    print(f"  N={n} K={k} {' '.join(extra)}: fastest round {res['fastest']:.4f} s (median "
          f"{res['median']:.4f}); CPU per round: DeviceActors {res['actor_cpu']:.3f} s, the "
          f"rest {res['rest_cpu']:.3f} s", flush=True)
    return res


def population_cost(n: int, rounds: int, out: Path) -> float:
    """CPU seconds per round per population device: the serial executor (everything in this
    process) at K=10 with N and 4N devices, median CPU per round over rounds 2..R."""
    from raymm.app.api import run

    per_round = []
    for nn in (n, 4 * n):
        cpu = [time.process_time()]
        run(SCENARIO, [f"dataset.clients={nn}", f"population.devices={nn}", "selection.k=10",
                       f"rounds={rounds + 1}", "eval.every=1000000"], out=out,
            executor="serial", on_round=lambda row, cpu=cpu: cpu.append(time.process_time()))
        per_round.append(statistics.median(b - a for a, b in zip(cpu[1:rounds], cpu[2:])))
        print(f"  N={nn} K=10 serial: CPU {per_round[-1]:.4f} s/round", flush=True)
    return (per_round[1] - per_round[0]) / (3 * n)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def node_ports() -> list[str]:
    """Explicit free ports for what a node listens on: no clash with other Rays here."""
    names = ["node-manager-port", "object-manager-port", "dashboard-agent-grpc-port",
             "dashboard-agent-listen-port", "metrics-export-port", "runtime-env-agent-port"]
    return [f"--{n}={free_port()}" for n in names]


@contextmanager
def two_nodes(log_dir: Path) -> Iterator[tuple[str, dict[str, str]]]:
    """A head and a worker node of one CPU each on 127.0.0.1 with token auth; yields the
    address and the environment a driver needs (the token). Stopped by terminating the two
    `ray start --block` processes (never `ray stop`, which would stop every Ray on the
    machine)."""
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(16)}
    port = free_port()
    temp = tempfile.mkdtemp(prefix="rmc", dir="/tmp")  # short: unix socket paths are limited
    procs: list[subprocess.Popen] = []

    def start(args: list[str], name: str) -> None:
        log = log_dir / f"{name}.log"
        proc = subprocess.Popen([RAY, "start", *args, *node_ports(), *NODE], env=env,
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
        yield f"127.0.0.1:{port}", env
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


def measure_on(address: str, env: dict[str, str], args: argparse.Namespace) -> dict[str, float]:
    """`measure` on the cluster at `address`, in a child process: a process that already ran
    Ray without token auth keeps that setting, and would be refused by a token cluster."""
    cmd = [sys.executable, __file__, "--measure-at", address, "--n", str(args.n),
           "--k", str(args.k), "--rounds", str(args.rounds), "--mode", args.mode,
           "--out", str(args.out)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    line = next((x for x in done.stdout.splitlines() if x.startswith("MEASURED ")), None)
    if done.returncode != 0 or line is None:
        raise RuntimeError(f"two-node run failed ({done.returncode}):\n{done.stderr[-3000:]}")
    print(done.stdout.split("MEASURED ")[0].rstrip(), flush=True)
    return dict(json.loads(line[len("MEASURED "):]))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=5000, help="devices in the population")
    p.add_argument("--k", type=int, default=1000, help="devices per round (even)")
    p.add_argument("--rounds", type=int, default=8, help="rounds per run (2..R are measured)")
    p.add_argument("--mode", choices=["sequential", "lockstep"], default="sequential")
    p.add_argument("--gbit-s", type=float, default=10.0,
                   help="network bandwidth assumed for the transfer term on a real cluster")
    p.add_argument("--out", type=Path, default=Path("runs/cluster_model"))
    p.add_argument("--measure-at", help=argparse.SUPPRESS)  # the child of `measure_on`
    args = p.parse_args(argv)
    os.environ.setdefault("RAY_worker_niceness", "0")  # as `raymm bench`: compete on equal terms
    args.out.mkdir(parents=True, exist_ok=True)
    n, k, mode = args.n, args.k, args.mode
    if args.measure_at:
        # the nodes are the parent's children: read the parent's whole tree
        res = measure(n, k, args.rounds, mode, args.out,
                      [f"execution.address={args.measure_at}"], root=os.getppid())
        print("MEASURED " + json.dumps(res))
        return res
    print(f"standard workload, N={n}, {mode}, load average {os.getloadavg()[0]:.2f} "
          f"on {os.cpu_count()} CPUs", flush=True)
    local = ["execution.local_num_cpus=1"]
    runs = [measure(n, kk, args.rounds, mode, args.out, local) for kk in (k, k // 2, 10)]
    m = fit(runs)
    m["e"] = population_cost(n, args.rounds, args.out)
    m["a"] -= m["e"] * n  # the K=10 run paid the population's share at N: keep it in e*N
    print(f"model: a = {m['a'] * 1e3:.1f} ms/round, b = {m['b'] * 1e6:.1f} us per selected "
          f"device outside the actors, c = {m['c'] * 1e6:.1f} us per selected device inside "
          f"them, e = {m['e'] * 1e6:.2f} us per population device", flush=True)
    with two_nodes(args.out) as (address, env):
        nodes = measure_on(address, env, args)
    pred = predict(m, k, 2, 0.0, n)  # on one machine the transfer is a memory copy
    model_cpu = m["c"] * k
    print(f"two nodes x 1 DeviceActor, N={n} K={k}: model {pred:.4f} s/round; measured fastest "
          f"round {nodes['fastest']:.4f} ({(nodes['fastest'] - pred) / pred:+.0%}), median "
          f"{nodes['median']:.4f}; DeviceActor CPU {nodes['actor_cpu']:.3f} s/round (model "
          f"{model_cpu:.3f})")

    sizing = []
    big_n = 1_000_000
    for kk in (1_000, 10_000, 100_000):
        xfer = transfer_s(32, kk, big_n, PARAMS, args.gbit_s)
        for target in (1.0, 10.0):
            sizing.append({"N": big_n, "K": kk, "target_s": target,
                           "transfer_s": round(xfer, 4),
                           "actors": actors_needed(m, kk, target, xfer, big_n)})
    print(f"N={big_n}: DeviceActors needed (transfer at {args.gbit_s:g} Gbit/s, 32 nodes):")
    for row in sizing:
        print(f"  K={row['K']:>7} target {row['target_s']:>4g} s/round: "
              f"{row['actors'] or 'out of reach (a + e*N + b*K alone exceed it)'} "
              f"(transfer {row['transfer_s']:.3f} s)")
    result = {"N": n, "K": k, "mode": mode, "rounds": args.rounds,
              "load_avg": os.getloadavg(), "one_actor_runs": runs, "model": m,
              "predicted_2nodes": pred, "two_nodes": nodes, "sizing": sizing}
    (args.out / "cluster_model.json").write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
