"""The GPU check: what a machine with an NVIDIA GPU must show, in one command (see gpu_check.sh).

0. Repeatability: the same small scenario run twice on the GPU, sequential and lock-step, gives
   the same final parameters (SHA-256 of every group's bytes); it prints
   "deterministic on <GPU>: same sha" or the difference, and which operations torch reported
   as having no deterministic CUDA kernel. Without a GPU the same check runs on the CPU.
1. Lock-step training on `cuda` agrees with the CPU (every parameter within --tol after a few
   rounds of a small scenario; TF32 is switched off so the GPU computes in float32).
2. Fractional-GPU packing: four DeviceActors asking for `num_gpus: 0.25` each on one GPU, each
   naming the torch device it trains on.
3. Seconds per steady round at 5000/500 and 100000/10000 devices (the standard workload,
   lock-step, serial executor), GPU against CPU.

Results go to OUT/gpu_check.json and OUT/gpu_check.md. Without a usable GPU the script still runs
every CPU part and says that the GPU parts did not run (`--cpu-only` forces that, for testing);
`--parts` runs only some of them.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from raymm.app.api import run
from raymm.app.bench import parse_sizes, run_raymm
from raymm.app.build import build_world, load_scenario, make_executor

QUICKSTART = Path(__file__).resolve().parents[1] / "scenarios" / "quickstart.yaml"
PARTS = ("repeat", "agreement", "packing", "timing")
#: what torch's warning says about an operation without a deterministic CUDA kernel
NO_DETERMINISTIC_KERNEL = "does not have a deterministic implementation"


def environment() -> dict[str, Any]:
    cuda = torch.cuda.is_available()
    return {"python": platform.python_version(), "torch": torch.__version__,
            "cuda_available": cuda, "torch_cuda": torch.version.cuda,
            "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
            if cuda else []}


def params_sha(params: dict[str, np.ndarray]) -> str:
    """SHA-256 over every parameter group's name, dtype, shape and bytes, in name order."""
    h = hashlib.sha256()
    for name in sorted(params):
        a = np.ascontiguousarray(params[name])
        h.update(f"{name}:{a.dtype}:{a.shape};".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def repeatability(out: Path, rounds: int, device: str, scenario: str | Path = QUICKSTART,
                  overrides: tuple[str, ...] = ()) -> dict[str, Any]:
    """A scenario (the quickstart: MLP encoders) run twice on `device`, sequential and
    lock-step: the SHA-256 of each run's final parameters, whether the two agree, and the
    largest difference when not. torch's warnings about operations without a deterministic
    kernel are collected."""
    base = [*overrides, f"rounds={rounds}", "execution.executor=serial",
            "output.tensorboard=false", f"execution.accelerator={device}"]
    rows: dict[str, Any] = {}
    ops: set[str] = set()
    for mode in ("sequential", "lockstep"):
        params = []
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(2):
                res = run(load_scenario(scenario, [
                    *base, f"execution.training.path={mode}"]),
                    out=out / "repeat")
                params.append(res.params)
        ops |= {str(w.message).split("\n")[0] for w in caught
                if NO_DETERMINISTIC_KERNEL in str(w.message)}
        shas = [params_sha(p) for p in params]
        row: dict[str, Any] = {"sha": shas, "same": shas[0] == shas[1]}
        if not row["same"]:
            row["max_abs_diff"] = max(float(np.max(np.abs(params[0][g] - params[1][g])))
                                      for g in params[0])
        rows[mode] = row
    settings = {"deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
                "cudnn.deterministic": torch.backends.cudnn.deterministic,
                "cudnn.benchmark": torch.backends.cudnn.benchmark}
    return {"device": device, "scenario": str(scenario), "rounds": rounds, "runs": rows,
            "settings": settings,
            "nondeterministic_ops": sorted(ops),
            "same": all(r["same"] for r in rows.values())}


def repeat_line(rep: dict[str, Any], where: str) -> str:
    """One sentence: deterministic on WHERE (same sha), or the difference."""
    if rep["same"]:
        sha = rep["runs"]["sequential"]["sha"][0][:16]
        runs = f"{rep['rounds']} round{'s' if rep['rounds'] != 1 else ''}"
        line = (f"deterministic on {where}: same sha in two runs of {runs}, "
                f"sequential and lock-step (sequential {sha}...)")
    else:
        diffs = "; ".join(f"{mode}: {r['sha'][0][:12]} vs {r['sha'][1][:12]}, largest "
                          f"difference {r['max_abs_diff']:.3g}" if not r["same"] else
                          f"{mode}: same sha" for mode, r in rep["runs"].items())
        line = f"NOT deterministic on {where}: {diffs}"
    if rep["nondeterministic_ops"]:
        line += ("; torch reported operations without a deterministic kernel: "
                 + " | ".join(rep["nondeterministic_ops"]))
    return line


def agreement(out: Path, rounds: int, tol: float, gpu: bool) -> dict[str, Any]:
    """Final parameters of a lock-step run on each device, and their largest difference."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    base = [f"rounds={rounds}", "execution.training.path=lockstep", "execution.executor=serial",
            "output.tensorboard=false"]
    params = {}
    seconds = {}
    for device in (["cpu", "cuda"] if gpu else ["cpu"]):
        t0 = time.perf_counter()
        res = run(load_scenario(QUICKSTART, [*base, f"execution.accelerator={device}"]),
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
        "execution.actor.num_cpus=0.5", f"execution.accelerator={'cuda' if gpu else 'auto'}",
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
            r = run_raymm(n, k, rounds, 0, "lockstep", "serial", out / "timing",
                          [f"execution.accelerator={device}", "output.tensorboard=false"])
            rows.append({"N": n, "K": k, "device": device, "steady_s": r["steady_s"],
                         "round_seconds": r["round_seconds"], "peak_mb": r["peak_mb"]})
            print(f"  {n}/{k} on {device}: {r['steady_s']:.3f} s per steady round", flush=True)
    return rows


def markdown(res: dict[str, Any]) -> str:
    env = res["environment"]
    lines = ["# GPU check", "",
             f"torch {env['torch']} (CUDA {env['torch_cuda']}), GPUs: "
             f"{', '.join(env['gpus']) or 'none'}", ""]
    if "repeat" in res:
        lines.append(f"0. {repeat_line(res['repeat'], res['where'])}")
    if "agreement" in res:
        agr = res["agreement"]
        if res["gpu"]:
            lines.append(f"1. cuda vs cpu after {agr['rounds']} lock-step rounds: largest "
                         f"parameter difference {agr['max_abs_diff']:.2e} (tolerance "
                         f"{agr['tol']:g}): {'agrees' if agr['agrees'] else 'DOES NOT AGREE'}")
        else:
            lines.append("1. not run on a GPU (no usable CUDA device); the CPU run took "
                         f"{agr['seconds']['cpu']:.1f} s")
    if "packing" in res:
        pack = res["packing"]
        lines.append(f"2. {len(pack['actors'])} DeviceActors at num_gpus="
                     f"{pack['num_gpus_each']:g}: "
                     + ", ".join(f"GPU {p['gpu_ids']} -> {p['torch_device']}"
                                 for p in pack["actors"]))
    if "timing" in res:
        lines += ["3. seconds per steady round (standard workload, lock-step, serial)", "",
                  "| N | K | device | s/round | peak MB |", "|---|---|---|---|---|"]
        lines += [f"| {r['N']} | {r['K']} | {r['device']} | {r['steady_s']:.3f} | "
                  f"{r['peak_mb']:.0f} |" for r in res["timing"]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS),
                   help="which checks to run (default: all)")
    p.add_argument("--sizes", default="5000:500,100000:10000")
    p.add_argument("--rounds", type=int, default=3, help="timed rounds per size (steady: 2..)")
    p.add_argument("--repeat-rounds", type=int, default=3)
    p.add_argument("--repeat-scenario", default=str(QUICKSTART),
                   help="scenario of the repeatability check (default: the quickstart, MLP "
                        "encoders; e.g. a HAR or audio-visual one for the CNN encoders)")
    p.add_argument("--repeat-set", action="append", default=[], metavar="KEY=VALUE",
                   help="override for the repeatability check's scenario (repeatable)")
    p.add_argument("--agree-rounds", type=int, default=3)
    p.add_argument("--tol", type=float, default=1e-4)
    p.add_argument("--actors", type=int, default=4)
    p.add_argument("--cpu-only", action="store_true", help="skip the GPU even if there is one")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    gpu = torch.cuda.is_available() and not args.cpu_only
    res: dict[str, Any] = {"environment": environment(), "gpu": gpu}
    res["where"] = (res["environment"]["gpus"][0] if gpu
                    else f"CPU ({platform.processor() or platform.machine()})")
    print(f"GPU check ({'on ' + res['where'] if gpu else 'no GPU: CPU parts only'})", flush=True)
    if "repeat" in args.parts:
        res["repeat"] = repeatability(args.out, args.repeat_rounds, "cuda" if gpu else "cpu",
                                      args.repeat_scenario, tuple(args.repeat_set))
        print(repeat_line(res["repeat"], res["where"]), flush=True)
    if "agreement" in args.parts:
        res["agreement"] = agreement(args.out, args.agree_rounds, args.tol, gpu)
    if "packing" in args.parts:
        res["packing"] = packing(args.actors, gpu)
    if "timing" in args.parts:
        res["timing"] = timing(args.sizes, args.rounds, args.out, gpu)
    (args.out / "gpu_check.json").write_text(json.dumps(res, indent=1, default=str))
    (args.out / "gpu_check.md").write_text(markdown(res))
    print(markdown(res), flush=True)
    return res


if __name__ == "__main__":
    main()
