"""Where a round's time goes, phase by phase (serial executor: every phase in this process).

    python tools/round_phases.py scenarios/bench/standard.yaml --rounds 14 \
        --set dataset.clients=5000 --set population.devices=5000 --set selection.k=500

runs the scenario on the serial executor without evaluations and prints the steady round time
(median and mean over rounds 3..R: round 1 carries start-up, round 2 the first allocations of
full size), per phase the milliseconds per steady round spent in it, and per round the devices
whose lock-step program fell back to sequential training (a phase's time means little when
some did; the trainer's warnings say why). The phases are the regions the code marks with
`raymm.phases.phase` (`PHASES` lists the ones reported), timed by a `PhaseClock`. Phases nest
(the local update is part of the lock-step programs, which are part of the host's training), so
they do not add up; what the host's training leaves of a round is the server's and the
engine's. On Ray the host phases run in the DeviceActors, each on its share of the selected
devices, and Ray's hops come on top (docs/cluster.md measures them). In a `torch.profiler`
trace the same phases appear by name under `raymm.phases.recorded()`.

`--kernels` also times torch's kernels inside the steady rounds, by kind (the encoders'
convolutions forward and backward, matrix products, everything else), with their call counts;
watching every call costs a few microseconds each, so the round is slower while it runs and the
kernel seconds are what to read. `--kernels --ops N` adds the N operations that took longest,
each with the line of the project's code that ran it (for the reverse pass: the line that asked
for the gradient); small operations read high there, since watching costs the same per call.
`--ablate KEY=VALUE` (repeatable) runs the scenario once more
per override and prints the steady round's change: switching one loss term or part off at a
time (`objective.lambda_cs=0`, `model.adapter=false` ...) says what it costs, forward and
backward together.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from raymm.phases import PhaseClock

#: (phase name, what it is), outermost first: the regions the code marks with
#: `raymm.phases.phase`, read here by a `PhaseClock`
PHASES = [
    ("host.train.sequential", "host: training (sequential)"),
    ("host.train.lockstep", "host: training (lock-step)"),
    ("lockstep.program", "  lock-step programs"),
    ("local_update", "    local update (minibatch loop)"),
    ("optimizer.step", "      optimizer steps"),
    ("optimizer.step.lockstep_adam", "      optimizer steps (lock-step Adam)"),
    ("lockstep.frozen_encoders", "      frozen encoders (once a round)"),
    ("lockstep.minibatch_orders", "    minibatch orders"),
    ("lockstep.rows", "    rows out of the stacks"),
    ("host.block_sums", "  block sums"),
    ("server.plan", "server: selection and schedule"),
    ("server.aggregate", "server: aggregation"),
    ("server.evaluate", "server: evaluation"),
]


def by_label(seconds: dict[str, float]) -> dict[str, float]:
    """A clock's seconds per phase name as seconds per `PHASES` label, every label present."""
    return {label: seconds.get(name, 0.0) for name, label in PHASES}


#: kernel kinds `--kernels` reports, by the aten operations they hold
KERNELS = {
    "convolution forward": ("convolution",),
    "convolution backward": ("convolution_backward",),
    "matrix products (mm, bmm, addmm, ...)": ("mm", "bmm", "addmm", "baddbmm", "addbmm"),
}


class KernelTimer:
    """Seconds and calls of torch's kernels by kind (`KERNELS`, the rest as "other"), counted
    only while `on`. A dispatch mode: it sees the kernels vmap and autograd run, not the
    Python-level calls. With `sites`, also by operation and the line of the project's code
    that ran it (`call_site`)."""

    def __init__(self, sites: bool = False) -> None:
        from torch.utils._python_dispatch import TorchDispatchMode
        kind_of = {op: kind for kind, ops in KERNELS.items() for op in ops}
        self.seconds = dict.fromkeys([*KERNELS, "other"], 0.0)
        self.calls = dict.fromkeys(self.seconds, 0)
        #: (operation, call site) -> seconds and calls, with `sites`
        self.op_seconds: Counter[tuple[str, str]] = Counter()
        self.op_calls: Counter[tuple[str, str]] = Counter()
        self.on = False
        timer = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
                if not timer.on:
                    return func(*args, **(kwargs or {}))
                op = func._schema.name.partition("::")[2]
                kind = kind_of.get(op, "other")
                start = time.perf_counter()
                try:
                    return func(*args, **(kwargs or {}))
                finally:
                    spent = time.perf_counter() - start
                    timer.seconds[kind] += spent
                    timer.calls[kind] += 1
                    if sites:
                        key = (op, call_site())
                        timer.op_seconds[key] += spent
                        timer.op_calls[key] += 1

        self.mode = Mode()


#: the project's own packages, for `call_site`
OWN_PACKAGES = ("raymm", "policies", "actors")


def _own_roots() -> tuple[str, ...]:
    """The folders of the project's packages, each ending in a separator (a path such as the
    virtual environment's `~/.cache/raymm/venv-...` may contain a package's name)."""
    roots: list[str] = []
    for name in OWN_PACKAGES:
        spec = importlib.util.find_spec(name)
        for folder in (spec.submodule_search_locations or []) if spec else []:
            roots += [os.path.join(folder, ""), os.path.join(os.path.realpath(folder), "")]
    return tuple(dict.fromkeys(roots))


def call_site() -> str:
    """`package/file:line (function)` of the innermost frame of the project's code on the
    stack: for an operation of the reverse pass, the line that asked for the gradient."""
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_filename
        root = next((r for r in OWN_ROOTS if name.startswith(r)), None)
        if root is not None:
            top = os.path.basename(os.path.dirname(root))
            return f"{top}/{name[len(root):]}:{frame.f_lineno} ({frame.f_code.co_name})"
        frame = frame.f_back
    return "(outside the project)"


OWN_ROOTS = _own_roots()


def profile(scenario: Path, overrides: list[str], rounds: int, out: Path,
            kernels: KernelTimer | None = None, fallbacks: list[int] | None = None
            ) -> tuple[list[float], dict[str, float]]:
    """(wall seconds of rounds 1..R, seconds per phase summed over rounds 3..R); `kernels`
    counts the kernels of rounds 3..R; `fallbacks` gets, per round 1..R, the devices whose
    lock-step program fell back to sequential training (the row's `lockstep_fallbacks`). One
    round more runs uncounted: a run's last round ends with the final evaluation."""
    from raymm.app.api import run

    walls: list[float] = []
    counted: dict[str, float] = {}
    with PhaseClock() as clock:
        def on_round(row: dict[str, Any]) -> None:
            if row["round"] > rounds:
                return
            walls.append(row["wall_seconds"])
            if fallbacks is not None:
                fallbacks.append(int(row.get("lockstep_fallbacks", 0)))
            if row["round"] == 2:
                clock.reset()
                if kernels is not None:
                    kernels.on = True
            if row["round"] == rounds:
                counted.update(clock.seconds)
                if kernels is not None:
                    kernels.on = False

        watch = kernels.mode if kernels is not None else contextlib.nullcontext()
        with watch:
            run(scenario, [*overrides, f"rounds={rounds + 1}", "eval.every=1000000"], out=out,
                executor="serial", on_round=on_round)
    return walls, by_label(counted or clock.seconds)


def kernel_report(kernels: KernelTimer, steady_rounds: int) -> str:
    lines = ["kernels per steady round (ms, calls):"]
    for kind, s in kernels.seconds.items():
        calls = kernels.calls[kind] / steady_rounds
        lines.append(f"  {kind:40s} {1e3 * s / steady_rounds:8.2f} {calls:8.0f}")
    return "\n".join(lines)


def ops_report(kernels: KernelTimer, steady_rounds: int, top: int) -> str:
    """The `top` operations by time, each with the line of the project's code that ran it."""
    lines = [f"top {top} operations per steady round (ms, calls, where):"]
    for (op, site), s in kernels.op_seconds.most_common(top):
        calls = kernels.op_calls[(op, site)] / steady_rounds
        lines.append(f"  {1e3 * s / steady_rounds:8.2f} {calls:8.1f}  {op:28s} {site}")
    return "\n".join(lines)


def steady_ms(walls: list[float]) -> float:
    """Median wall milliseconds of rounds 3..R."""
    return 1e3 * statistics.median(walls[2:])


def report(walls: list[float], seconds: dict[str, float],
           fallbacks: list[int] | None = None) -> str:
    steady = walls[2:]
    lines = [f"steady round (rounds 3..{len(walls)}): median {1e3 * statistics.median(steady):.2f}"
             f" ms, mean {1e3 * statistics.mean(steady):.2f} ms", "ms per steady round:"]
    lines += [f"  {label:40s} {1e3 * s / len(steady):8.2f}" for label, s in seconds.items() if s]
    if fallbacks is not None:   # why: the lock-step trainer's warnings
        lines.append(f"lock-step fallbacks per round (devices trained sequentially instead): "
                     f"{fallbacks}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("scenario", type=Path)
    p.add_argument("--rounds", type=int, default=14, help="rounds to run (at least 3)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="scenario override, as for `raymm run`")
    p.add_argument("--out", type=Path, default=Path("runs/phases"))
    p.add_argument("--kernels", action="store_true",
                   help="also time torch's kernels by kind (slows the round down)")
    p.add_argument("--ops", type=int, default=0, metavar="N",
                   help="with --kernels: also the N operations that take longest, each with "
                        "the line of raymm's (or a policy's) code that ran it")
    p.add_argument("--ablate", action="append", default=[], metavar="KEY=VALUE",
                   help="run once more with this override and print the change (repeatable)")
    args = p.parse_args(argv)
    if args.rounds < 3:
        p.error("--rounds: at least 3 (rounds 1 and 2 are not steady)")
    base, rounds = args.set, args.rounds
    fallbacks: list[int] = []
    walls, seconds = profile(args.scenario, base, rounds, args.out, fallbacks=fallbacks)
    print(report(walls, seconds, fallbacks))
    if args.ops and not args.kernels:
        p.error("--ops: only with --kernels")
    if args.kernels:
        kernels = KernelTimer(sites=args.ops > 0)
        k_walls, _ = profile(args.scenario, base, rounds, args.out, kernels)
        print(f"(with the kernels watched: steady round {steady_ms(k_walls):.2f} ms)")
        print(kernel_report(kernels, len(k_walls) - 2))
        if args.ops:
            print(ops_report(kernels, len(k_walls) - 2, args.ops))
    if args.ablate:
        ref = steady_ms(walls)
        print(f"ablations (steady round, median; the scenario as given: {ref:.2f} ms):")
        for change in args.ablate:
            a_walls, _ = profile(args.scenario, [*base, change], rounds, args.out)
            ms = steady_ms(a_walls)
            print(f"  {change:40s} {ms:8.2f} ms  ({ms - ref:+.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
