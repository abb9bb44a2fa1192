"""Data bigger than memory: the memory-mapped stress scenario's size on disk, the memory of
its whole process tree and its seconds per round, against the same scenario in memory at a size
that fits.

    RAYMM_DATA=/a/folder/with/10/GiB/free nice -n 19 \\
        python tools/mmap_stress.py --out results/mmap_stress --delete-data

1. Generates the dataset of `tools/stress/mmap_8g.yaml` (8.5 GiB of .npy files under
   `$RAYMM_DATA/synthetic_mmap`) unless it is there, and reports its size on disk.
2. Runs the scenario, each run in a child process of its own, on each executor (`--executors`):
   with 2 rows per client (`tiny`: the cost of the run itself, without its training data), at
   8.5 GiB mapped, then at 1.1 GiB (125 clients of the same 1,100 rows; `SMALL`) mapped and
   read whole into memory (`dataset.mmap=false`). A mapped run goes twice: first with the
   files' pages evicted from the page cache (`cold`: every row a host reads comes from disk),
   then again (`warm`: the rows the same selections read are cached). On Ray the scenario
   runs its server in the driver (`execution.server: driver`) and hosts every device in one
   DeviceActor; it runs again with two DeviceActors, and with a ServerActor. This process
   samples the child's whole process tree (the driver, Ray's daemons, every actor): its
   resident set every 0.5 s, each physical page counted once however many of the tree's
   processes map it (`raymm.app.treemem`: what the tree holds, whatever else runs on the
   machine), and its PSS every 0.2 s (shared pages split between the processes that map them,
   outside the tree too, so it reads lower on a busy machine).
3. Prints a table, and writes it with every figure to OUT/table.md and OUT/mmap_stress.json.

Seconds per round are the mean of rounds 2.. (round 1 carries start-up), evaluation rounds
included; on the serial executor also the CPU time of the process. The machine may be shared:
compare the rows of one table, measured minutes apart, rather than seconds across days.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from raymm.app.api import run
from raymm.app.bench import MemorySampler, steady
from raymm.app.build import load_scenario
from raymm.data import load_dataset
from raymm.data.synthetic_mmap import MappedParams, SyntheticMmapLoader, size_on_disk

REPO = Path(__file__).resolve().parents[1]
SCENARIO = REPO / "tools" / "stress" / "mmap_8g.yaml"
#: the same scenario at 1.1 GiB: 125 clients of the same 1,100 rows each, 10 per round
SMALL = ["dataset.n_train=137500", "dataset.clients=125", "population.devices=125"]
#: the same scenario with 2 rows per client: what the run costs without its training data
TINY = ["dataset.n_train=2000"]
#: settings under every case (the tests make the whole table small with them)
BASE: list[str] = []
GIB = 2**30


def data_folder(overrides: list[str]) -> tuple[Path, int]:
    """The folder the scenario's dataset lives in, and its bytes (headers aside)."""
    sc = load_scenario(SCENARIO, overrides)
    params = MappedParams(**sc.dataset_params())
    return SyntheticMmapLoader().folder(params, sc.seed), size_on_disk(params)


def generate(overrides: list[str]) -> dict[str, Any]:
    """Generate the dataset if absent; its folder, size on disk and generation time."""
    sc = load_scenario(SCENARIO, overrides)
    t0 = time.perf_counter()
    load_dataset(sc.dataset_name, sc.dataset_params(), sc.seed)
    seconds = time.perf_counter() - t0
    folder, _ = data_folder(overrides)
    files = [f for f in folder.iterdir() if f.suffix == ".npy"]
    return {"folder": str(folder), "files": len(files),
            "bytes": sum(f.stat().st_size for f in files),
            "allocated_bytes": sum(f.stat().st_blocks * 512 for f in files),
            "load_or_generate_s": round(seconds, 1)}


def evict(folder: Path) -> None:
    """Drop the files' pages from the page cache (clean pages of files no one maps)."""
    for f in folder.glob("*.npy"):
        fd = os.open(f, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def cached_bytes(folder: Path) -> int | None:
    """Bytes of the files now in the page cache (util-linux `fincore`), None without it."""
    if shutil.which("fincore") is None:
        return None
    out = subprocess.run(["fincore", "--bytes", "--noheadings", "--raw", "--output", "RES",
                          *map(str, sorted(folder.glob("*.npy")))],
                         capture_output=True, text=True, check=False).stdout
    return sum(int(x) for x in out.split()) if out.strip() else None


def child(overrides: list[str], executor: str, out: Path) -> dict[str, Any]:
    """One run in this process (the child): round times, CPU per round, accuracy."""
    cpu = [time.process_time()]

    def tick(row: dict[str, Any]) -> None:
        cpu.append(time.process_time())

    res = run(SCENARIO, overrides, out=out, executor=executor, on_round=tick)
    walls = [float(r["wall_seconds"]) for r in res.rows]
    cpus = [b - a for a, b in zip(cpu, cpu[1:])]
    return {"round_seconds": [round(w, 3) for w in walls], "steady_s_per_round": steady(walls),
            "steady_cpu_s_per_round": steady(cpus) if executor == "serial" else None,
            "final_accuracy": res.summary.get("final_accuracy")}


def measured(name: str, overrides: list[str], executor: str, out: Path,
             cold: bool | None) -> dict[str, Any]:
    """`child` in a fresh process, with the memory of its process tree sampled from here."""
    folder, size = data_folder(overrides)
    if cold:
        evict(folder)
    cached = cached_bytes(folder)
    cmd = [sys.executable, __file__, "--child", "--executor", executor, "--out", str(out),
           *[a for o in overrides for a in ("--set", o)]]
    with MemorySampler(every=0.05, tree_every=4, resident_every=0.5) as mem:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        mem.root = proc.pid
        stdout, _ = proc.communicate()
    line = next((x for x in stdout.splitlines() if x.startswith("MMAP ")), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(f"{name} on {executor} failed ({proc.returncode})")
    mapped = not any(o == "dataset.mmap=false" for o in overrides)
    return {"case": name, "executor": executor, "mapped": mapped,
            "cache": ("cold" if cold else "warm") if mapped else "-",
            "data_gib": size / GIB, "cached_before_gib": None if cached is None
            else cached / GIB, "tree_pss_peak_gib": mem.tree_peak / GIB,
            "tree_resident_peak_gib": None if mem.resident_peak is None
            else mem.resident_peak / GIB,
            "machine_used_peak_gib": (mem.peak - mem.base) / GIB,
            **json.loads(line[len("MMAP "):])}


def table(rows: list[dict[str, Any]]) -> str:
    head = ("| case | executor | data (GiB) | page cache | tree resident peak (GiB) | "
            "tree PSS peak (GiB) | s/round | CPU s/round | accuracy |")
    lines = [head, "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        cpu = r["steady_cpu_s_per_round"]
        acc = r["final_accuracy"]
        res = r["tree_resident_peak_gib"]
        lines.append(f"| {r['case']} | {r['executor']} | {r['data_gib']:.2f} | {r['cache']} | "
                     f"{'-' if res is None else f'{res:.2f}'} | {r['tree_pss_peak_gib']:.2f} | "
                     f"{r['steady_s_per_round']:.3f} | "
                     f"{'-' if cpu is None else f'{cpu:.3f}'} | "
                     f"{'-' if acc is None else f'{acc:.4f}'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("runs/mmap_stress"),
                   help="where the table and the JSON go (the runs go to a temporary folder)")
    p.add_argument("--executors", default="serial,ray", help="comma-separated: serial, ray")
    p.add_argument("--delete-data", action="store_true",
                   help="delete the generated datasets at the end")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--executor", default="serial", help=argparse.SUPPRESS)
    p.add_argument("--set", dest="overrides", action="append", default=[],
                   help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print("MMAP " + json.dumps(child(args.overrides, args.executor, args.out)), flush=True)
        return []
    executors = [e.strip() for e in args.executors.split(",") if e.strip()]
    big = generate(BASE)
    print(f"dataset: {big['bytes'] / GIB:.2f} GiB in {big['files']} files "
          f"({big['allocated_bytes'] / GIB:.2f} GiB allocated) at {big['folder']}; "
          f"generated or found in {big['load_or_generate_s']} s", flush=True)
    small = generate([*BASE, *SMALL])
    tiny = generate([*BASE, *TINY])
    cases = [("tiny, mapped", [*BASE, *TINY], False),
             ("large, mapped", BASE, True), ("large, mapped", BASE, False),
             ("small, mapped", [*BASE, *SMALL], True), ("small, mapped", [*BASE, *SMALL], False),
             ("small, in memory", [*BASE, *SMALL, "dataset.mmap=false"], None)]
    # on Ray, also with the devices in two DeviceActors (what one more actor process costs) and
    # with the server in a ServerActor of its own instead of the driver (what that costs)
    on_ray = [("large, mapped, 2 DeviceActors", [*BASE, "execution.devices_per_actor=500"], False),
              ("tiny, mapped, ServerActor", [*BASE, *TINY, "execution.server=actor"], False),
              ("large, mapped, ServerActor", [*BASE, "execution.server=actor"], False)]
    rows = []
    with tempfile.TemporaryDirectory(prefix="mmap_stress_") as runs:
        for executor in executors:
            for name, overrides, cold in cases + (on_ray if executor == "ray" else []):
                r = measured(name, overrides, executor, Path(runs), cold)
                rows.append(r)
                print(f"{r['case']}, {executor}, {r['cache']}: tree resident peak "
                      f"{r['tree_resident_peak_gib']} GiB, PSS peak "
                      f"{r['tree_pss_peak_gib']:.2f} GiB, {r['steady_s_per_round']:.3f} s/round",
                      flush=True)
    text = table(rows)
    print(text)
    command = "RAYMM_DATA=... nice -n 19 python tools/mmap_stress.py " + \
        shlex.join(argv if argv is not None else sys.argv[1:])
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "mmap_stress.json").write_text(json.dumps(
        {"command": command, "scenario": str(SCENARIO.relative_to(REPO)), "small": SMALL,
         "tiny": TINY, "dataset": big, "small_dataset": small, "tiny_dataset": tiny,
         "runs": rows}, indent=1) + "\n")
    (args.out / "table.md").write_text(
        f"`{command}`\n\nDataset: {big['bytes'] / GIB:.2f} GiB on disk ({big['bytes']:,} "
        f"bytes in {big['files']} .npy files); the 1.1 GiB comparison: "
        f"{small['bytes'] / GIB:.2f} GiB.\n\n{text}\n")
    if args.delete_data:
        for d in (big, small, tiny):
            shutil.rmtree(d["folder"], ignore_errors=True)
        print("deleted the generated data", flush=True)
    return rows


if __name__ == "__main__":
    main()
