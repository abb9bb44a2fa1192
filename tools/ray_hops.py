"""Where a Ray round's time goes between the processes: Ray's hops alone, and a scenario's rounds.

    python tools/ray_hops.py --result-kb 10,360 --work-ms 0,2.5,12 --rounds 60
    python tools/ray_hops.py --scenario scenarios/bench/standard.yaml --rounds 60

starts a local Ray on 127.0.0.1 with two CPUs as a run does (`ensure_ray`; with RAY_ADDRESS
set, it connects to that cluster instead), its workers not niced as in `raymm bench`, a server
actor without a CPU (as the ServerActor) and two worker actors with one CPU each (as two
DeviceActors), and runs the chain that `actors.ray_executor` submits for a round, all of it
before waiting once: the server's plan, each worker's training (busy for `--work-ms`, then a
float64 result of `--result-kb`, as a DeviceActor's block sums), the server's aggregation of
both results, and the driver's get. The plan and the aggregation are busy for `--plan-ms` and
`--agg-ms` (by default a 5000/500 bench round's server times, measured on the serial executor).

Every step stamps the monotonic clock, one clock for every process of a machine, and the
script prints each hop's median over the rounds after the first five: the driver's submission
reaching the plan, the plan reaching the later worker, the later worker's result reaching the
aggregation, the aggregation's record reaching the driver, and what the round cost beyond the
busy loops. That last column is the floor of Ray's share of a raymm round with results of that
size, on this machine, before raymm does anything: a Ray round cannot take less than its
training, its server work and that.

`--scenario` runs a scenario's rounds on the Ray executor instead (`--set` overrides it; no
evaluation) and reads Ray's own record of every task (`ray.timeline`): per steady round, when
the DeviceActors' `train` tasks started after the driver submitted the round, how long they
took (and how much of the longest was Ray reading its arguments and storing its results), when
the aggregation started after the last of them ended, how long it took, and when its record
reached the driver.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

import numpy as np

#: rounds left out of the medians: the first calls start the actors' task loops
WARM_ROUNDS = 5
HOPS = ["driver->plan", "plan->train", "result->aggregation", "record->driver",
        "round", "hops"]


def chain_actors(plan_ms: float, agg_ms: float, work_ms: float, result_kb: float
                 ) -> tuple[Any, Any]:
    """The server actor and the worker actor class. Defined in here, with what they call, so
    that Ray ships them by value: the workers cannot import this script."""
    # deferred: Ray takes seconds to import, --help does not need it
    import ray

    def busy(ms: float) -> None:
        """Keep this process's core busy for `ms` milliseconds, as training would."""
        end = time.perf_counter() + ms / 1e3
        a = np.ones(256)
        while time.perf_counter() < end:
            a *= 1.0000001

    @ray.remote(num_cpus=0)
    class Server:
        def plan(self, t: int) -> tuple[int, float, float]:
            start = time.perf_counter()
            busy(plan_ms)
            return t, start, time.perf_counter()

        def aggregate(self, t: int, *results: tuple[np.ndarray, float, float]
                      ) -> tuple[float, float, list[float], list[float]]:
            start = time.perf_counter()
            busy(agg_ms)
            return (start, time.perf_counter(), [r[1] for r in results],
                    [r[2] for r in results])

    @ray.remote(num_cpus=1)
    class Worker:
        def train(self, plan: tuple[int, float, float]) -> tuple[np.ndarray, float, float]:
            start = time.perf_counter()
            busy(work_ms)
            return np.ones(int(result_kb * 1024) // 8), start, time.perf_counter()

    return Server, Worker


def measure(result_kb: float, work_ms: float, rounds: int, plan_ms: float = 0.45,
            agg_ms: float = 0.75) -> dict[str, float]:
    """Median milliseconds of each of `HOPS` over the rounds after the first `WARM_ROUNDS`.
    Uses the Ray this process is connected to (the caller starts it)."""
    # deferred: as in `chain_actors`
    import ray

    server_cls, worker_cls = chain_actors(plan_ms, agg_ms, work_ms, result_kb)
    server, workers = server_cls.remote(), [worker_cls.remote() for _ in range(2)]
    rows = []
    try:
        for t in range(rounds + WARM_ROUNDS):
            submitted = time.perf_counter()
            plan = server.plan.remote(t)
            results = [w.train.remote(plan) for w in workers]
            agg_start, agg_end, starts, ends = ray.get(server.aggregate.remote(t, *results))
            back = time.perf_counter()
            _, plan_start, plan_end = ray.get(plan)
            round_ms = back - submitted
            rows.append([plan_start - submitted, max(starts) - plan_end,
                         agg_start - max(ends), back - agg_end, round_ms,
                         round_ms - (plan_ms + work_ms + agg_ms) / 1e3])
    finally:
        for a in (server, *workers):
            ray.kill(a)
    kept = np.array(rows[WARM_ROUNDS:]) * 1e3
    return {hop: float(statistics.median(kept[:, i])) for i, hop in enumerate(HOPS)}


#: per steady round of a scenario on Ray (`scenario_rounds`), in milliseconds
TIMELINE = ["submit->train", "train", "its arguments", "its results", "train->aggregation",
            "aggregation", "aggregation->driver", "round"]
#: Ray's own steps inside a task, as its timeline names them
READ_ARGS, STORE_RESULTS = "task:deserialize_arguments", "task:store_outputs"


def scenario_rounds(path: str, overrides: list[str], rounds: int) -> list[dict[str, float]]:
    """`rounds` steady rounds of a scenario on the Ray executor (after `WARM_ROUNDS`, no
    evaluation), each as `TIMELINE`'s milliseconds read from Ray's task events. Uses the Ray
    this process is connected to, or starts one as a run would."""
    # deferred: as in `chain_actors` (raymm brings torch)
    import ray

    from raymm.app.build import build_world, load_scenario, make_executor, with_executor
    from raymm.sim.engine import run_round

    total = rounds + WARM_ROUNDS
    # one round more than is run: the last round of a run is always evaluated
    sc = with_executor(load_scenario(path, [*overrides, f"rounds={total + 1}",
                                            f"eval.every={total + 1}"]), "ray")
    ex = make_executor(sc)
    if getattr(ex, "run_rounds", None) is not None:   # an asynchronous aggregator's loop
        raise SystemExit(f"ray_hops: {path} runs asynchronously; only synchronous rounds are "
                         "timed here")
    spans = []
    try:
        ex.prestart(sc)
        ex.start(build_world(sc))
        ex.ready()
        for t in range(1, total + 1):
            start = time.time()
            run_round(ex, t, sc)
            spans.append((start * 1e6, time.time() * 1e6))
        events = ray.timeline()
    finally:
        ex.shutdown()
    return [row for s, e in spans[WARM_ROUNDS:] if (row := _round(events, s, e)) is not None]


def _round(events: list[dict[str, Any]], start: float, end: float) -> dict[str, float] | None:
    """`TIMELINE` of the round the driver ran from `start` to `end` (microseconds since the
    epoch, as Ray's events); None if its trains or its aggregation are not among them."""
    inside = [e for e in events if start <= e["ts"] <= end and e.get("ph") == "X"]
    trains = [e for e in inside if e["cat"].endswith("DeviceActor.train")]
    aggs = [e for e in inside if e["cat"].endswith(".aggregate")]
    if not trains or not aggs:
        return None
    agg, longest = aggs[0], max(trains, key=lambda e: e["dur"])
    last_end = max(e["ts"] + e["dur"] for e in trains)

    def ray_step(name: str) -> float:
        return sum(e["dur"] for e in inside if e["tid"] == longest["tid"] and e["name"] == name
                   and longest["ts"] <= e["ts"] <= longest["ts"] + longest["dur"])
    us = {"submit->train": max(e["ts"] for e in trains) - start, "train": longest["dur"],
          "its arguments": ray_step(READ_ARGS), "its results": ray_step(STORE_RESULTS),
          "train->aggregation": agg["ts"] - last_end,
          "aggregation": agg["dur"], "aggregation->driver": end - agg["ts"] - agg["dur"],
          "round": end - start}
    return {k: v / 1e3 for k, v in us.items()}


def table(columns: list[str], rows: list[list[float]], first: int) -> str:
    """A right-aligned text table; the first `first` columns are the row's labels."""
    widths = [max(9, len(c)) for c in columns]
    head = " ".join(f"{c:>{w}}" for c, w in zip(columns, widths))
    lines = [head, "-" * len(head)]
    for row in rows:
        lines.append(" ".join(f"{v:{w}.{1 if i < first else 2}f}"
                              for i, (v, w) in enumerate(zip(row, widths))))
    return "\n".join(lines)


def floats(text: str) -> list[float]:
    """A comma-separated list of non-negative numbers (an argparse type)."""
    try:
        values = [float(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a comma-separated list of numbers: {text!r}") from None
    if any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"negative value in {text!r}")
    return values


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--result-kb", type=floats, default=[10.0, 360.0],
                    help="sizes of each worker's result in KiB, comma-separated")
    ap.add_argument("--work-ms", type=floats, default=[0.0, 12.0],
                    help="each worker's busy milliseconds per round, comma-separated")
    ap.add_argument("--rounds", type=int, default=60, help="rounds measured (per cell)")
    ap.add_argument("--plan-ms", type=float, default=0.45)
    ap.add_argument("--agg-ms", type=float, default=0.75)
    ap.add_argument("--scenario", help="time this scenario's rounds on Ray instead")
    ap.add_argument("--set", dest="overrides", action="append", default=[],
                    metavar="KEY=VALUE", help="scenario override (repeatable)")
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")

    # deferred: as in `chain_actors`
    import ray

    from actors.ray_executor import ensure_ray
    from raymm.config.schema import ExecutionSpec
    from raymm.errors import RaymmError

    os.environ.setdefault("RAY_worker_niceness", "0")  # as `raymm bench`: no nice 15 workers
    started = ensure_ray(ExecutionSpec(local_num_cpus=2))   # as a run starts its local Ray
    try:
        if args.scenario:
            try:
                rows = scenario_rounds(args.scenario, args.overrides, args.rounds)
            except RaymmError as exc:
                print(f"ray_hops: {exc}", file=sys.stderr)
                return 2
            if not rows:
                print("ray_hops: Ray's timeline held no whole round", file=sys.stderr)
                return 1
            medians = [statistics.median(r[c] for r in rows) for c in TIMELINE]
            print(f"{args.scenario}: medians over {len(rows)} steady rounds, in ms (train: the "
                  "longest DeviceActor task; its arguments, its results: Ray reading the "
                  "former and storing the latter within it)")
            print(table(TIMELINE, [medians], 0))
        else:
            cells = [[kb, work, *measure(kb, work, args.rounds, args.plan_ms,
                                         args.agg_ms).values()]
                     for kb in args.result_kb for work in args.work_ms]
            print(table(["result KB", "work ms", *HOPS], cells, 2))
            print("medians in ms; hops: the round less the plan, the training and the "
                  "aggregation (their busy loops)")
    finally:
        if started:
            ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
