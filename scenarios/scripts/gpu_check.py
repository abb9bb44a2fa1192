"""The GPU check: what a machine with an NVIDIA GPU must show, in one command (see gpu_check.sh).

1. Lock-step training on `cuda` agrees with the CPU (every parameter within --tol after a few
   rounds of a small scenario; TF32 is switched off so the GPU computes in float32).
2. Fractional-GPU packing: four DeviceActors asking for `num_gpus: 0.25` each on one GPU, each
   naming the torch device it trains on.
3. Seconds per steady round at 5000/500 and 100000/10000 devices (the standard workload,
   lock-step, serial executor), GPU against CPU.

Results go to OUT/gpu_check.json and OUT/gpu_check.md. Without a usable GPU the script still runs
every CPU part and says that the GPU parts did not run (`--cpu-only` forces that, for testing).
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from raymm.app.api import run
from raymm.app.bench import parse_sizes, run_raymm
from raymm.app.build import build_world, load_scenario, make_executor

QUICKSTART = "scenarios/quickstart.yaml"


def environment() -> dict[str, Any]:
    cuda = torch.cuda.is_available()
    return {"python": platform.python_version(), "torch": torch.__version__,
            "cuda_available": cuda, "torch_cuda": torch.version.cuda,
            "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
            if cuda else []}


def agreement(out: Path, rounds: int, tol: float, gpu: bool) -> dict[str, Any]:
    """Final parameters of a lock-step run on each device, and their largest difference."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    base = [f"rounds={rounds}", "training.vectorise=true", "execution.executor=serial",
            "output.tensorboard=false"]
    params = {}
    seconds = {}
    for device in (["cpu", "cuda"] if gpu else ["cpu"]):
        t0 = time.perf_counter()
        res = run(load_scenario(QUICKSTART, [*base, f"execution.device={device}"]),
                  out=out / "agreement")
        seconds[device] = time.perf_counter() - t0
        params[device] = res.params
    row: dict[str, Any] = {"rounds": rounds, "seconds": seconds, "tol": tol}
    if gpu:
        diff = max(float(np.max(np.abs(params["cuda"][g] - params["cpu"][g])))
                   for g in params["cpu"])
        row.update(max_abs_diff=diff, agrees=diff <= tol)
    return row


def packing(actors: int, gpu: bool) -> dict[str, Any]:
    """Start `actors` DeviceActors sharing one GPU and read back where each one trains."""
    import ray

    share = 1.0 / actors
    sc = load_scenario(QUICKSTART, [
        "execution.executor=ray", f"execution.actor.num_gpus={share}",
        "execution.actor.num_cpus=0.5", f"execution.device={'cuda' if gpu else 'auto'}",
        f"execution.devices_per_actor={-(-20 // actors)}", "population.devices=20",
        "selection.k=8", "output.tensorboard=false"])
    if not gpu:  # no GPU here: declare one so Ray packs the actors as it would on a GPU node
        ray.init(num_cpus=2, num_gpus=1, include_dashboard=False, log_to_driver=False,
                 _node_ip_address="127.0.0.1")
    world = build_world(sc)
    ex = make_executor(sc)
    try:
        ex.start(world)
        placed = ex.placements()
    finally:
        ex.shutdown()
        ray.shutdown()
    return {"num_gpus_each": share, "actors": placed,
            "all_on_cuda": all(p["torch_device"] == "cuda" for p in placed)}


def timing(sizes: str, rounds: int, out: Path, gpu: bool) -> list[dict[str, Any]]:
    rows = []
    for n, k in parse_sizes(sizes):
        for device in (["cpu", "cuda"] if gpu else ["cpu"]):
            r = run_raymm(n, k, rounds, 0, "vectorised", "serial", out / "timing",
                          [f"execution.device={device}", "output.tensorboard=false"])
            rows.append({"N": n, "K": k, "device": device, "steady_s": r["steady_s"],
                         "round_seconds": r["round_seconds"], "peak_mb": r["peak_mb"]})
            print(f"  {n}/{k} on {device}: {r['steady_s']:.3f} s per steady round", flush=True)
    return rows


def markdown(res: dict[str, Any]) -> str:
    env, agr, pack = res["environment"], res["agreement"], res["packing"]
    lines = ["# GPU check", "",
             f"torch {env['torch']} (CUDA {env['torch_cuda']}), GPUs: "
             f"{', '.join(env['gpus']) or 'none'}", ""]
    if res["gpu"]:
        lines.append(f"1. cuda vs cpu after {agr['rounds']} lock-step rounds: largest parameter "
                     f"difference {agr['max_abs_diff']:.2e} (tolerance {agr['tol']:g}): "
                     f"{'agrees' if agr['agrees'] else 'DOES NOT AGREE'}")
    else:
        lines.append("1. not run on a GPU (no usable CUDA device); the CPU run took "
                     f"{agr['seconds']['cpu']:.1f} s")
    lines.append(f"2. {len(pack['actors'])} DeviceActors at num_gpus={pack['num_gpus_each']:g}: "
                 + ", ".join(f"GPU {p['gpu_ids']} -> {p['torch_device']}"
                             for p in pack["actors"]))
    lines += ["3. seconds per steady round (standard workload, lock-step, serial)", "",
              "| N | K | device | s/round | peak MB |", "|---|---|---|---|---|"]
    lines += [f"| {r['N']} | {r['K']} | {r['device']} | {r['steady_s']:.3f} | "
              f"{r['peak_mb']:.0f} |" for r in res["timing"]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--sizes", default="5000:500,100000:10000")
    p.add_argument("--rounds", type=int, default=3, help="timed rounds per size (steady: 2..)")
    p.add_argument("--agree-rounds", type=int, default=3)
    p.add_argument("--tol", type=float, default=1e-4)
    p.add_argument("--actors", type=int, default=4)
    p.add_argument("--cpu-only", action="store_true", help="skip the GPU even if there is one")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    gpu = torch.cuda.is_available() and not args.cpu_only
    res: dict[str, Any] = {"environment": environment(), "gpu": gpu}
    where = "on " + res["environment"]["gpus"][0] if gpu else "no GPU: CPU parts only"
    print(f"GPU check ({where})", flush=True)
    res["agreement"] = agreement(args.out, args.agree_rounds, args.tol, gpu)
    res["packing"] = packing(args.actors, gpu)
    res["timing"] = timing(args.sizes, args.rounds, args.out, gpu)
    (args.out / "gpu_check.json").write_text(json.dumps(res, indent=1, default=str))
    (args.out / "gpu_check.md").write_text(markdown(res))
    print(markdown(res), flush=True)
    return res


if __name__ == "__main__":
    main()
