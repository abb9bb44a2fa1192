"""Where round 1's extra time goes on Ray: a per-phase breakdown of start-up.

    python tools/startup.py [SCENARIO] [--set key=value ...] [--rounds N]

Default: `tools/stress/devices_10k.yaml` with two DeviceActors
(`execution.devices_per_actor=5000`), 4 rounds. Two parts:

* `phases` (a fresh process, as cold as a DeviceActor): importing torch and raymm, loading the
  data and population, building a host (model, FLOP count, lock-step trainer), planning round 1,
  and the first and second training call of one host -- what each costs the first time.
* `run`: `raymm.run` on Ray, timed from the call: Ray start, actor creation, data, the executor's
  start, each round's end, and what each DeviceActor reports about its own start-up (process
  spawn, imports, shared objects, host build, warm-up), plus round 1's `wall_seconds` against
  the steady rounds'.

Timings on a loaded machine are loaded figures: give `uptime` with them.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ROOT / "tools/stress/devices_10k.yaml"


def phases(scenario: str, overrides: list[str]) -> dict[str, float]:
    """Cold, in this process: what each start-up step costs the first time."""
    out: dict[str, float] = {}
    t = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal t
        now = time.perf_counter()
        out[name] = now - t
        t = now

    import torch  # noqa: F401
    lap("import torch")
    import actors.device_actor  # noqa: F401
    import raymm.device.lockstep_host  # noqa: F401
    lap("import raymm (actor modules)")
    from raymm.app.build import build_world, load_scenario
    lap("import raymm.app.api (driver: policies, pydantic)")
    sc = load_scenario(scenario, overrides)
    lap("load_scenario")
    world = build_world(sc)
    lap("build_world (data + population)")
    from raymm.models.build import build_model
    from raymm.models.size import flops_per_sample
    model = build_model(world.dataset, sc.model, sc.seed)
    lap("build_model")
    dynamo_before = "torch._dynamo" in sys.modules
    flops_per_sample(model, world.dataset)
    lap("flops_per_sample (FlopCounterMode)")
    out["torch._dynamo imported by FlopCounterMode"] = float(
        not dynamo_before and "torch._dynamo" in sys.modules)
    import numpy as np

    from raymm.device.lockstep_host import make_host
    from raymm.server.server import Server
    ids = np.arange(0, min(world.population.n, 5000))
    host = make_host(ids, world.population, world.dataset, world.host_spec)
    lap("make_host (one host of <=5000 devices)")
    if "--warm" in sys.argv:
        from raymm.device.warmup import warm_up
        warm_up(host)
        lap("warm_up")
    server = Server(sc, world.dataset, world.population, world.policies)
    lap("Server()")
    for rnd in (1, 2, 3):
        plan, bcast = server.plan(rnd, [host.report_online(rnd)])
        lap(f"plan round {rnd}")
        dyn = "torch._dynamo" in sys.modules
        host.train(plan, bcast)
        lap(f"train round {rnd} ({int(host.selected(plan).size)} devices)")
        if not dyn and "torch._dynamo" in sys.modules:
            out[f"torch._dynamo imported by train round {rnd}"] = 1.0
        server.aggregate(rnd, plan, [], None)
        lap(f"aggregate round {rnd} (no results)")
    return out


def run(scenario: str, overrides: list[str]) -> dict[str, Any]:
    """`raymm.run` on Ray, with the time from the call to each step and to each round's end."""
    t0 = time.perf_counter()
    import ray

    import actors.ray_executor as rex
    import raymm.app.api as api
    from actors.ray_executor import RayExecutor
    marks: dict[str, float] = {"import raymm.app.api": time.perf_counter() - t0}
    t0, wall0 = time.perf_counter(), time.time()
    holder: dict[str, Any] = {}

    def timed(name: str, fn: Any) -> Any:
        def wrapper(*a: Any, **k: Any) -> Any:
            try:
                return fn(*a, **k)
            finally:
                marks.setdefault(f"{name} done", time.perf_counter() - t0)
        return wrapper

    original_make = api.make_executor

    def make(sc: Any) -> Any:
        ex = original_make(sc)
        holder["ex"] = ex
        return ex

    api.build_world = timed("build_world", api.build_world)  # type: ignore[assignment]
    api._new_run = timed("_new_run (run dir, pictures)", api._new_run)  # type: ignore
    rex.ensure_ray = timed("ray.init", rex.ensure_ray)  # type: ignore[assignment]
    api.make_executor = timed("make_executor", make)  # type: ignore[assignment]
    for name in ("prestart", "start", "ready"):
        if hasattr(RayExecutor, name):
            setattr(RayExecutor, name, timed(f"executor.{name}", getattr(RayExecutor, name)))
    actor_report: list[Any] = []

    def on_round(row: dict[str, Any]) -> None:
        marks[f"round {row['round']} end"] = time.perf_counter() - t0
        if row["round"] == 1:
            ex = holder["ex"]
            if hasattr(ex.actors[0], "startup"):
                actor_report.extend(ray.get([a.startup.remote() for a in ex.actors]))
        return None

    res = api.run(scenario, overrides=overrides, executor="ray", on_round=on_round,
                  out="/tmp/raymm_startup_bench")
    marks["raymm.run returned"] = time.perf_counter() - t0
    walls = [float(r["wall_seconds"]) for r in res.rows]
    steady = sorted(walls[1:])[len(walls[1:]) // 2] if len(walls) > 1 else float("nan")
    for rep in actor_report:  # wall-clock times -> seconds from the call
        for k in [k for k in rep if k.endswith("_wall")]:
            rep[k.replace("_wall", "_s_from_call")] = rep.pop(k) - wall0
    return {"marks_s_from_call": marks, "round_wall_seconds": walls,
            "round1_minus_steady_s": walls[0] - steady, "actors": actor_report}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("scenario", nargs="?", default=str(DEFAULT))
    ap.add_argument("--set", action="append", default=[], dest="overrides")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--part", choices=["both", "phases", "run"], default="both")
    ap.add_argument("--warm", action="store_true", help="phases: warm the host up first")
    a = ap.parse_args()
    overrides = [f"rounds={a.rounds}", "execution.devices_per_actor=5000", *a.overrides]
    if a.part == "phases":
        for k, v in phases(a.scenario, overrides).items():
            print(f"  {k:55s} {v:8.3f}")
        return
    if a.part == "both":  # cold: a process of its own
        print("phases (fresh process; seconds):", flush=True)
        subprocess.run([sys.executable, __file__, a.scenario, "--part", "phases",
                        "--rounds", str(a.rounds), *(["--warm"] if a.warm else []),
                        *[f"--set={o}" for o in a.overrides]], check=True)
    out = run(a.scenario, overrides)
    print("raymm.run on Ray (seconds from the call):")
    for k, v in out["marks_s_from_call"].items():
        print(f"  {k:55s} {v:8.3f}")
    print("  round wall_seconds: " + ", ".join(f"{w:.3f}" for w in out["round_wall_seconds"]))
    print(f"  round 1 minus steady (median of rounds 2..): {out['round1_minus_steady_s']:.3f}")
    for i, rep in enumerate(out["actors"]):
        print(f"  DeviceActor {i}: " + json.dumps({k: round(v, 3) for k, v in rep.items()}))


if __name__ == "__main__":
    main()
