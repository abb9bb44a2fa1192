"""The asynchronous loop at scale: real seconds per 1,000 arrivals and peak memory of FedBuff
with C devices in flight, against a synchronous FedAvg round of K = C on the same population.

    python experiments/async/async_scale.py tools/stress/devices_100k.yaml \
        --concurrency 1000 --buffer 100 --arrivals 3000 --out results/async

Each mode runs in a child process of its own (its peak RSS is its own). Seconds per 1,000
arrivals: the wall time of the server steps after the first 1,000 arrivals (the start fills C
slots at once), the last step (it evaluates) left out, scaled to 1,000 arrivals; CPU time of
the process over the same steps beside it (on a shared machine other processes stretch the
wall time). The synchronous round: the mean over rounds 2.. of a run with K = C and an
evaluation only at its end (left out). Both on the serial executor with the scenario's
lock-step training. Writes OUT/async_scale.json.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def child(scenario: str, mode: str, c: int, m: int, arrivals: int, rounds_sync: int,
          extra: list[str]) -> dict[str, Any]:
    """One run in this process; its measurements."""
    # deferred: the parent process only spawns children
    import raymm

    steps = arrivals // m + 1
    sets = ["execution.executor=serial", f"eval.every={10**6}", "output.tensorboard=false",
            "output.checkpoint_every=0", "clock.mode=seconds", *extra]
    if mode == "fedbuff":
        sets += [f"rounds={steps}", "aggregation.name=fedbuff",
                 f"aggregation.concurrency={c}", f"aggregation.buffer={m}",
                 f"selection.k={c}"]
    else:
        sets += [f"rounds={rounds_sync}", f"selection.k={c}"]
    cpu: list[float] = []

    def tick(row: dict[str, Any]) -> None:
        ru = resource.getrusage(resource.RUSAGE_SELF)
        cpu.append(ru.ru_utime + ru.ru_stime)

    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as out:
        res = raymm.run(scenario, sets, out=out, on_round=tick)
    total = time.perf_counter() - t0
    rows = res.rows
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # MiB (Linux: KiB)
    if mode == "fedbuff":
        first = c // m  # steps until the first 1,000 (C) arrivals
        steady = list(range(first, len(rows) - 1))
        n_arr = len(steady) * m
        wall = sum(rows[i]["wall_seconds"] for i in steady)
        cpu_s = cpu[steady[-1]] - cpu[steady[0] - 1]
        per = 1000.0 / n_arr
        stale = [rows[i]["async/staleness_mean"] for i in steady]
        return {"mode": mode, "concurrency": c, "buffer": m, "arrivals_measured": n_arr,
                "wall_s_per_1000_arrivals": wall * per, "cpu_s_per_1000_arrivals": cpu_s * per,
                "staleness_mean": sum(stale) / len(stale), "peak_rss_mib": peak,
                "total_wall_s": total, "devices": res.summary["devices"],
                "sim_seconds_per_1000_arrivals": sum(rows[i]["sim_seconds"] for i in steady)
                * per}
    steady = list(range(1, len(rows) - 1))
    wall = sum(rows[i]["wall_seconds"] for i in steady) / len(steady)
    cpu_s = (cpu[steady[-1]] - cpu[steady[0] - 1]) / len(steady)
    return {"mode": mode, "k": c, "rounds_measured": len(steady),
            "wall_s_per_round": wall, "cpu_s_per_round": cpu_s,
            "participated_per_round": sum(rows[i]["participated"] for i in steady)
            / len(steady), "peak_rss_mib": peak, "total_wall_s": total,
            "devices": res.summary["devices"],
            "sim_seconds_per_round": sum(rows[i]["sim_seconds"] for i in steady) / len(steady)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("scenario")
    ap.add_argument("--concurrency", type=int, default=1000)
    ap.add_argument("--buffer", type=int, default=100)
    ap.add_argument("--arrivals", type=int, default=3000)
    ap.add_argument("--sync-rounds", type=int, default=4)
    ap.add_argument("--modes", nargs="+", default=["fedbuff", "sync"])
    ap.add_argument("--out", default="results/async")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a scenario override for both modes (repeatable)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a.scenario, a.child, a.concurrency, a.buffer, a.arrivals,
                               a.sync_rounds, a.set)))
        return
    found = []
    for mode in a.modes:
        cmd = [sys.executable, __file__, a.scenario, "--child", mode, "--concurrency",
               str(a.concurrency), "--buffer", str(a.buffer), "--arrivals", str(a.arrivals),
               "--sync-rounds", str(a.sync_rounds), *[f"--set={x}" for x in a.set]]
        got = subprocess.run(cmd, capture_output=True, text=True, check=True)
        found.append(json.loads(got.stdout.strip().splitlines()[-1]))
        print(json.dumps(found[-1]), flush=True)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "async_scale.json").write_text(json.dumps(
        {"scenario": a.scenario, "overrides": a.set, "runs": found}, indent=1) + "\n")


if __name__ == "__main__":
    main()
