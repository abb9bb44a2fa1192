"""`raymm bench`: the standard workload on raymm next to the bare single-process loop.

For each size (N clients, K per round) it runs, in this process tree, the bare loop (a child
process: `python -m raymm.app.bare_loop`, or the script `--bare-loop PATH`) and the scenario
`bench/standard.yaml` on raymm with sequential and with lock-step local
training (Ray executor by default: one DeviceActor per CPU, one torch thread each; `--executor
ray,serial` runs each mode on both), and prints the steady seconds per round (mean over rounds
2..R; round 1 carries start-up), the ratio to the bare loop and the peak memory; then the
round's arithmetic floor on this machine (`raymm.app.bench_floor`: its matrix products alone,
one thread), as seconds and as a ratio to the bare loop.

How it measures (the workload: docs/workload.md):
  * raymm's round time is the engine's wall time of the whole round: availability poll,
    selection, broadcast, training, gathering, aggregation. Both run R+1 rounds; raymm's round
    R+1 carries the final evaluation and is not counted (steady = rounds 2..R), the bare loop
    times its evaluation outside its rounds (steady = rounds 2..R+1). Final accuracies are
    then both after R+1 rounds.
  * Peak memory: machine-wide `MemTotal - MemAvailable`, sampled every 20 ms, peak minus its
    value before the run (a multi-process run has no single max RSS); other processes on a
    shared machine move this number. Next to it the peak PSS of the run's own process tree,
    which they do not; for the bare loop also its own max RSS. Summing the PSS of a Ray
    process tree reads the smaps of a dozen large processes, which on a few cores slows the
    round being timed and the one after it (docs/performance.md, "Smaller mechanisms"); so
    raymm's tree is read only after the last timed round and after the final, evaluating
    round, which no timed round follows, and the bare loop's, whose one busy core leaves the
    other free, every second. The table shows the fastest run's numbers, bench.json every run's.
  * Lock-step fallbacks: a lock-step run's devices per round whose lock-step program raised
    and that trained sequentially instead (the rows' `lockstep_fallbacks`), printed per round
    and in the table; a fallback makes the round slower, not other.
  * Ray nices its worker processes to 15; on a machine shared with other work that makes the
    DeviceActors yield the CPU to everything else while the bare loop runs at nice 0. The bench
    starts Ray with `RAY_worker_niceness=0` (unless set) so both compete on equal terms.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from raymm.app.scenarios import scenario_root
from raymm.app.treemem import tree_pss_bytes, tree_resident_bytes
from raymm.errors import RaymmError

SCENARIO = scenario_root() / "bench" / "standard.yaml"
#: the bare loop that ships with raymm, run as a module (`--bare-loop PATH` runs another)
BARE_LOOP_MODULE = "raymm.app.bare_loop"
MODES = ("sequential", "lockstep")
#: the modes' old names, still accepted
OLD_MODES = {"vectorised": "lockstep"}


class MemorySampler:
    """Peak of machine-wide used memory (`MemTotal - MemAvailable`) above its starting value,
    and (every `tree_every`-th sample, or when asked) peak PSS of this process and all its
    descendants -- the run's own processes only: the driver, a child bare loop, Ray's daemons
    and workers. PSS splits shared pages (torch's libraries, the object store) between the
    processes mapping them, outside the tree too; with `resident_every` (seconds) also the
    peak resident set of the tree, each physical page counted once (`raymm.app.treemem`): what
    the tree holds whatever else runs on the machine. A resident sample reads every process's
    page map (costly for a torch process), hence its own, slower cadence."""

    def __init__(self, every: float = 0.02, root: int | None = None,
                 tree_every: int | None = 50, resident_every: float | None = None) -> None:
        self.every = every
        self.tree_every = tree_every  # PSS every this many samples; None: only `sample_tree`
        self.resident_every = resident_every
        self.root = root or os.getpid()  # whose process tree to sum; may be set later
        self.base = self.peak = used_bytes()
        self.tree_peak = 0
        self.resident_peak: int | None = None
        self._last_resident = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        i = 0
        while not self._stop.wait(self.every):
            self.peak = max(self.peak, used_bytes())
            if self.tree_every and i % self.tree_every == 0:
                self.sample_tree()
            if self.resident_every and time.monotonic() - self._last_resident \
                    >= self.resident_every:
                self.sample_resident()
            i += 1

    def sample_tree(self) -> None:
        self.tree_peak = max(self.tree_peak, tree_pss_bytes(self.root))

    def sample_resident(self) -> None:
        self._last_resident = time.monotonic()
        now = tree_resident_bytes(self.root)
        if now is not None:
            self.resident_peak = max(self.resident_peak or 0, now)

    def __enter__(self) -> MemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, used_bytes())

    @property
    def peak_mb(self) -> float:
        return (self.peak - self.base) / 2**20

    @property
    def tree_pss_mb(self) -> float:
        return self.tree_peak / 2**20


def used_bytes() -> int:
    """`MemTotal - MemAvailable` from /proc/meminfo (0 where there is none)."""
    try:
        info = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    except OSError:
        return 0
    kib = {k: int(v.split()[0]) for k, v in info.items() if k in ("MemTotal", "MemAvailable")}
    return (kib["MemTotal"] - kib["MemAvailable"]) * 1024


def settle(timeout: float = 5.0, quiet_mb: float = 8.0) -> None:
    """Wait until machine-wide used memory stops falling (the previous run's processes are
    still exiting after `ray.shutdown`), so the next run's baseline is not inflated."""
    deadline = time.monotonic() + timeout
    last, calm = used_bytes(), 0
    while calm < 3 and time.monotonic() < deadline:
        time.sleep(0.1)
        now = used_bytes()
        calm = calm + 1 if abs(now - last) < quiet_mb * 2**20 else 0
        last = now


def steady(seconds: Sequence[float]) -> float:
    """Mean seconds per round over rounds 2.. (round 1 carries one-time start-up)."""
    rest = list(seconds[1:]) or list(seconds)
    return sum(rest) / len(rest)


def bare_command(path: Path | None) -> list[str]:
    """The command that starts the bare loop: raymm's own module, or the script at `path`
    (any implementation of docs/workload.md with its flags and its `RESULT {json}` line)."""
    return [sys.executable, *(["-m", BARE_LOOP_MODULE] if path is None else [str(path)])]


def run_bare(path: Path | None, n: int, k: int, rounds: int, seed: int) -> dict[str, Any]:
    cmd = [*bare_command(path), "--clients", str(n), "--per-round", str(k),
           "--rounds", str(rounds + 1), "--seed", str(seed)]
    settle()
    with MemorySampler() as mem:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        mem.root = proc.pid
        stdout, stderr = proc.communicate()
    line = next((x for x in stdout.splitlines() if x.startswith("RESULT ")), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(f"bare loop failed ({proc.returncode}): {stderr[-2000:]}")
    res = json.loads(line[len("RESULT "):])
    return {"impl": "bare_loop", "steady_s": steady(res["round_seconds"]),
            "round_seconds": res["round_seconds"], "final_acc": res["final_acc"],
            "peak_mb": mem.peak_mb, "tree_pss_mb": mem.tree_pss_mb,
            "max_rss_mb": res["peak_rss_mb"]}


def run_raymm(n: int, k: int, rounds: int, seed: int, mode: str, executor: str,
              out: Path, extra: Sequence[str] = ()) -> dict[str, Any]:
    # deferred: `raymm --help` builds this command's parser without importing torch or Ray
    from raymm.app.api import run

    overrides = [f"dataset.clients={n}", f"population.devices={n}", f"selection.k={k}",
                 f"rounds={rounds + 1}", f"seed={seed}", "eval.every=1000000",
                 f"execution.training.path={mode}", *extra]
    settle()
    with MemorySampler(tree_every=None) as mem:
        def between_rounds(row: dict[str, Any]) -> None:
            if row["round"] >= rounds:  # no timed round follows: a read slows the next round
                mem.sample_tree()

        res = run(SCENARIO, overrides, out=out, executor=executor, on_round=between_rounds)
    walls = [r["wall_seconds"] for r in res.rows[:rounds]]  # the last round evaluates
    return {"impl": f"raymm {mode}", "executor": executor, "steady_s": steady(walls),
            "round_seconds": [round(w, 4) for w in walls],
            # devices per round whose lock-step program fell back to sequential training
            "fallbacks": [int(r.get("lockstep_fallbacks", 0)) for r in res.rows[:rounds]],
            "final_acc": res.summary["final_accuracy"], "peak_mb": mem.peak_mb,
            "tree_pss_mb": mem.tree_pss_mb}


def arithmetic_floor(n: int, k: int, extra: Sequence[str] = ()) -> dict[str, Any]:
    """The round's matrix products alone on one thread (`raymm.app.bench_floor`), with the
    scenario's sizes after `extra` overrides."""
    # deferred: `raymm --help` builds this command's parser without importing torch
    from raymm.app.bench_floor import matmul_floor, round_flops
    from raymm.app.build import load_scenario
    from raymm.data import dataset_params

    sc = load_scenario(SCENARIO, [f"dataset.clients={n}", f"population.devices={n}",
                                  f"selection.k={k}", *extra])
    ds: Any = dataset_params(sc.dataset_name, sc.dataset_params())   # defaults filled in
    sizes = {"k": k, "d": ds.dim, "h": sc.model.fusion_dim, "c": ds.classes,
             "s": ds.samples_per_client, "b": sc.training.batch_size,
             "epochs": sc.training.local_epochs}
    return {"N": n, "K": k, "seconds": matmul_floor(**sizes),
            "gflop": round_flops(**sizes) / 1e9}


def parse_executors(text: str) -> list[str]:
    """`ray,serial` -> ["ray", "serial"] (each at most once, in the order given)."""

    names = list(dict.fromkeys(x.strip() for x in text.split(",") if x.strip()))
    bad = [x for x in names if x not in ("ray", "serial")]
    if bad or not names:
        raise RaymmError(f"bench --executor: {text!r} is not ray, serial or ray,serial")
    return names


def parse_modes(text: str) -> list[str]:
    """`--modes`: training paths, comma-separated (an old name reads as its new one)."""
    modes = [OLD_MODES.get(m.strip(), m.strip()) for m in text.split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        raise RaymmError(f"bench: --modes {text!r}: choose from {', '.join(MODES)}")
    return modes


def parse_sizes(text: str) -> list[tuple[int, int]]:
    """`1000:100,5000:500` -> [(1000, 100), (5000, 500)]."""

    out = []
    for item in text.split(","):
        n, _, k = item.partition(":")
        try:
            size = (int(n), int(k))
        except ValueError:
            raise RaymmError(f"bench --sizes: {item!r} is not N:K (e.g. 1000:100)") from None
        if not 1 <= size[1] <= size[0] <= 10**7:
            raise RaymmError(f"bench --sizes: {item!r} needs 1 <= K <= N <= 10000000")
        out.append(size)
    return out


def build_parser(p: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    p = p or argparse.ArgumentParser(prog="raymm bench", description=__doc__.split("\n")[0])
    p.add_argument("--sizes", default="1000:100,5000:500", help="N:K pairs, comma-separated")
    p.add_argument("--rounds", type=int, default=5, help="R: rounds per run (steady = 2..R)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--modes", default=",".join(MODES), help="sequential,lockstep")
    p.add_argument("--executor", default="ray",
                   help="ray, serial, or both (ray,serial): every mode runs on each")
    env = os.environ.get("RAYMM_BARE_LOOP")
    p.add_argument("--bare-loop", type=Path, default=Path(env) if env else None, metavar="PATH",
                   help="another implementation of the workload to run as the bare loop (a "
                        "Python script; default: raymm's own, python -m raymm.app.bare_loop)")
    p.add_argument("--out", type=Path, default=Path("runs/bench"),
                   help="folder for the run directories and bench.json")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="extra scenario override for the raymm runs (repeatable)")
    p.add_argument("--repeat", type=int, default=1,
                   help="run every implementation this many times, interleaved, and keep each "
                        "one's fastest steady time (outside load only ever slows a run down)")
    return p


def main(args: argparse.Namespace) -> list[dict[str, Any]]:
    if args.bare_loop is not None and not args.bare_loop.is_file():
        raise RaymmError(f"bench: bare loop not found at {args.bare_loop} (--bare-loop and "
                         "RAYMM_BARE_LOOP name a script; unset, raymm's own loop runs)")
    os.environ.setdefault("RAY_worker_niceness", "0")
    modes = parse_modes(args.modes)
    executors = parse_executors(args.executor)
    rows: list[dict[str, Any]] = []
    floors: list[dict[str, Any]] = []
    for n, k in parse_sizes(args.sizes):
        runs: dict[str, list[dict[str, Any]]] = {}
        for _ in range(args.repeat):
            bare = run_bare(args.bare_loop, n, k, args.rounds, args.seed)
            runs.setdefault("bare_loop", []).append(bare)
            print(_line({"N": n, "K": k, **bare, "ratio": 1.0}), flush=True)
            for mode in modes:
                for executor in executors:
                    r = run_raymm(n, k, args.rounds, args.seed, mode, executor, args.out,
                                  args.overrides)
                    if len(executors) > 1:
                        r["impl"] = f"{r['impl']} ({executor})"
                    runs.setdefault(r["impl"], []).append(r)
                    print(_line({"N": n, "K": k, **r,
                                 "ratio": r["steady_s"] / bare["steady_s"]}), flush=True)
        bares = [r["steady_s"] for r in runs["bare_loop"]]
        base = min(bares)
        floor = arithmetic_floor(n, k, args.overrides)
        floor["ratio"] = floor["seconds"] / base
        floors.append(floor)
        print(_floor_line(floor), flush=True)
        for rs in runs.values():
            best = min(rs, key=lambda r: r["steady_s"])
            paired = sorted(r["steady_s"] / b for r, b in zip(rs, bares))
            rows.append({"N": n, "K": k, **best, "ratio": best["steady_s"] / base,
                         "ratio_paired_median": paired[len(paired) // 2],
                         "steady_all": [r["steady_s"] for r in rs],
                         "peak_mb_all": [round(r["peak_mb"]) for r in rs],
                         "tree_pss_mb_all": [round(r["tree_pss_mb"]) for r in rs],
                         **({"fallbacks_all": [sum(r["fallbacks"]) for r in rs]}
                            if "fallbacks" in best else {})})
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"cpus": os.cpu_count(), "load_avg": os.getloadavg(), "time": time.ctime(),
            "rounds": args.rounds, "executor": args.executor}
    (args.out / "bench.json").write_text(json.dumps({"meta": meta, "rows": rows,
                                                    "floors": floors}, indent=1))
    print(table(rows))
    print("arithmetic floor: the round's matrix products alone, on one thread (two "
          "DeviceActors split it)")
    for f in floors:
        print("  " + _floor_line(f))
    return rows


def _floor_line(f: dict[str, Any]) -> str:
    return (f"N={f['N']} K={f['K']} matrix products: {f['seconds']:.4f} s/round (ratio "
            f"{f['ratio']:.3f}), {f['gflop']:.3f} GFLOP at {f['gflop'] / f['seconds']:.0f} GFLOPS")


def _line(r: dict[str, Any]) -> str:
    fell = f", lock-step fallbacks per round {r['fallbacks']}" if "fallbacks" in r else ""
    return (f"N={r['N']} K={r['K']} {r['impl']}: steady {r['steady_s']:.4f} s/round "
            f"(ratio {r['ratio']:.3f}), rounds {r['round_seconds']}, acc {r['final_acc']}"
            f"{fell}")


def table(rows: list[dict[str, Any]]) -> str:
    head = f"{'N':>6} {'K':>5}  {'implementation':<25} {'steady s/round':>14} {'ratio':>7} " \
           f"{'paired':>7} {'final acc':>9} {'peak MB':>8} {'tree PSS MB':>11} {'fallbacks':>9}"
    lines = [head, "-" * len(head)]
    for r in rows:
        fell = str(max(r["fallbacks_all"])) if "fallbacks_all" in r else "-"
        lines.append(f"{r['N']:>6} {r['K']:>5}  {r['impl']:<25} {r['steady_s']:>14.4f} "
                     f"{r['ratio']:>7.3f} {r['ratio_paired_median']:>7.3f} "
                     f"{r['final_acc']:>9.4f} {r['peak_mb']:>8.0f} {r['tree_pss_mb']:>11.0f} "
                     f"{fell:>9}")
    lines.append("steady: fastest of the repeats; ratio: that over the bare loop's fastest; "
                 "paired: median over repeats of each run's ratio to the bare loop run just "
                 "before it; fallbacks: devices that fell back from lock-step to sequential "
                 "training in the timed rounds (the most of any repeat; per round: the lines "
                 "above)")
    return "\n".join(lines)
