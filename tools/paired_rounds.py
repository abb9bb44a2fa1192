"""Two checkouts' rounds of one scenario, taken in turns: a speed ratio that machine drift
leaves alone.

    python tools/paired_rounds.py scenarios/tide_har.yaml --rounds 14 \
        --a /path/to/old/checkout --b . --set execution.training.threads=1

starts one worker process per checkout (each imports raymm from its own checkout) and lets them
run the scenario on the serial executor one round at a time, alternately: while one runs a
round the other waits, so both see the same machine within a second. Which side goes first
swaps every round. It prints each steady round's milliseconds on both sides and their ratio
(b/a), then the medians and the quartiles of the ratios. On a shared machine whose speed swings
by minutes (up to 2x here), a ratio of rounds taken side by side holds steadier than one of
medians from runs minutes apart.

Both sides read the same scenario file. `--set` applies to both sides, `--set-a` / `--set-b`
to one (e.g. the lock-step switch on one side only). The two runs must do the same rounds for
the ratio to mean anything: same scenario, seed and overrides, or a change that keeps the
numbers. Evaluation is off (`eval.every` beyond the last round) so that every round is a
training round. A checkout must have `raymm.app.api.run` with `on_round` (7d67085, the code
issue 34 was filed against, has it).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import IO, Any

#: the worker: runs the scenario, reporting each round and waiting for a "go" before the next
WORKER = r"""
import json, os, sys, tempfile
from pathlib import Path
go, report = os.fdopen(int(sys.argv[1]), "r"), os.fdopen(int(sys.argv[2]), "w")
scenario, overrides = sys.argv[3], json.loads(sys.argv[4])

def on_round(row):
    report.write(json.dumps({"round": row["round"], "wall": row["wall_seconds"]}) + "\n")
    report.flush()
    return go.readline().strip() != "go"

if go.readline().strip() == "go":
    from raymm.app.api import run
    with tempfile.TemporaryDirectory() as out:
        run(Path(scenario), overrides, out=Path(out), executor="serial", on_round=on_round)
"""


class Worker:
    """One side: a process with its checkout first on the path, driven over two pipes."""

    def __init__(self, checkout: Path, scenario: Path, overrides: list[str]) -> None:
        go_r, self._go = os.pipe()
        self._report, rep_w = os.pipe()
        env = dict(os.environ, PYTHONPATH=str(checkout.resolve()))
        self.proc = subprocess.Popen(
            [sys.executable, "-c", WORKER, str(go_r), str(rep_w), str(scenario.resolve()),
             json.dumps(overrides)],
            cwd=checkout, env=env, pass_fds=(go_r, rep_w), stdout=subprocess.DEVNULL)
        os.close(go_r)
        os.close(rep_w)
        self.go: IO[str] = os.fdopen(self._go, "w")
        self.reports: IO[str] = os.fdopen(self._report, "r")

    def round(self) -> dict[str, Any]:
        """Let the worker run its next round (the first includes its start-up); its report."""
        self.go.write("go\n")
        self.go.flush()
        line = self.reports.readline()
        if not line:
            raise RuntimeError(f"the worker for {self.proc.args[-2]} stopped "
                               f"(exit code {self.proc.wait()}); its messages are above")
        return json.loads(line)

    def stop(self) -> None:
        """End the worker after its current round (it reads anything but "go" as stop)."""
        try:
            self.go.write("stop\n")
            self.go.flush()
            self.go.close()
        except BrokenPipeError:   # it has ended already
            pass
        self.proc.wait()


def paired(scenario: Path, a: Path, b: Path, rounds: int, common: list[str],
           only_a: list[str], only_b: list[str]) -> list[tuple[int, float, float]]:
    """(round, a's seconds, b's seconds) for every round, taken in turns."""
    base = [*common, f"rounds={rounds}", f"eval.every={rounds + 1}"]
    sides = [Worker(a, scenario, [*base, *only_a]), Worker(b, scenario, [*base, *only_b])]
    rows = []
    try:
        for r in range(1, rounds + 1):
            order = (0, 1) if r % 2 else (1, 0)
            got: dict[int, dict[str, Any]] = {}
            for i in order:
                got[i] = sides[i].round()
            if got[0]["round"] != got[1]["round"]:
                raise RuntimeError(f"the sides ran different rounds: {got}")
            rows.append((int(got[0]["round"]), float(got[0]["wall"]), float(got[1]["wall"])))
    finally:
        for side in sides:
            side.stop()
    return rows


def report(rows: list[tuple[int, float, float]], skip: int) -> str:
    """Per steady round (after the first `skip`) both sides' milliseconds and b/a; medians."""
    steady = rows[skip:]
    lines = [f"{'round':>5} {'a ms':>9} {'b ms':>9} {'b/a':>7}"]
    lines += [f"{r:>5} {1e3 * x:9.1f} {1e3 * y:9.1f} {y / x:7.3f}" for r, x, y in steady]
    ratios = sorted(y / x for _, x, y in steady)
    q = statistics.quantiles(ratios, n=4) if len(ratios) >= 2 else [ratios[0]] * 3
    lines.append(f"steady rounds {steady[0][0]}..{steady[-1][0]}: a median "
                 f"{1e3 * statistics.median(x for _, x, _ in steady):.1f} ms, b median "
                 f"{1e3 * statistics.median(y for _, _, y in steady):.1f} ms; b/a median "
                 f"{statistics.median(ratios):.3f} (quartiles {q[0]:.3f}-{q[2]:.3f})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("scenario", type=Path)
    ap.add_argument("--a", type=Path, required=True, help="the first checkout (the before)")
    ap.add_argument("--b", type=Path, default=Path("."), help="the second checkout (default .)")
    ap.add_argument("--rounds", type=int, default=14)
    ap.add_argument("--skip", type=int, default=2,
                    help="rounds left out of the figures (start-up, first allocations)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--set-a", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--set-b", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--json", type=Path, help="also write the rows here")
    args = ap.parse_args(argv)
    if args.rounds <= args.skip:
        ap.error(f"--rounds must exceed --skip ({args.skip})")
    for side in (args.a, args.b):
        if not (side / "raymm" / "__init__.py").is_file():
            ap.error(f"{side} is not a raymm checkout (no raymm/__init__.py)")
    rows = paired(args.scenario, args.a, args.b, args.rounds, args.set, args.set_a, args.set_b)
    print(report(rows, args.skip))
    if args.json:
        args.json.write_text(json.dumps({"a": str(args.a), "b": str(args.b), "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
