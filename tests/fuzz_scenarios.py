"""Scenario fuzzing shared by the property test and a longer campaign.

Every case mutates a valid scenario (one to four edits: replace any field, at any depth, with a
hostile value -- wrong types, bounds, NaN/inf, unicode, control characters, paths, sizes --,
delete or rename keys, add unknown ones, replace sections by scalars, empty or repeat lists),
runs `raymm validate` in-process, and when that passes runs one serial round into a fresh
`--out`. A case passes when every call returns 0 or 2 without a traceback, a 2 leaves `--out`
empty, nothing appears beside `--out` (nor in the campaign's folder or the working directory
the campaign runs in), and no call runs past the alarm.

    python tests/fuzz_scenarios.py --cases 2000 --seed 1     # prints the tally as JSON
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import json
import math
import os
import random
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from helpers import REPO, tiny_scenario  # noqa: E402

HOSTILE: list[Any] = [
    None, True, False, 0, -1, 1, 2, 3, 7, -(2**63), 2**63, 2**64, -(2**70), 10**12, 10**7,
    1e308, -1e308, 1e-308, math.nan, math.inf, -math.inf, 0.5, 1.5, -0.0, 0.999999, 1e-9,
    "", "a", "auto", "random", "fedavg", "none", "delta", "../../escape", "/dev/zero",
    "/dev/null", "/etc/passwd", "nul\x00byte", "\x1b[31mred\x1b[0m", "ü" * 5, "名前", "x" * 300,
    "a\nb", "1e7", "true", "${HOME}", "%s%n", [], [1], [None], ["a", "a"], [[[[[]]]]], {},
    {"x": 1}, {"name": "x"}, {"name": "bogus"}, {"sensors": ["a"], "fraction": 2},
]
SECTIONS = ["dataset", "population", "model", "training", "selection", "aggregation",
            "schedule", "objective", "execution", "eval", "output", "faults"]


def base_scenarios() -> list[dict[str, Any]]:
    """Valid starting points covering presets with cluster models, adapters, per-device eval
    and faults, so their parameters are mutated too."""
    fm = yaml.safe_load((REPO / "scenarios" / "fedmchain_synthetic.yaml").read_text())
    fm.update(rounds=2, output={"tensorboard": False})
    return [
        tiny_scenario(**{"rounds": 1, "output.tensorboard": False}),
        tiny_scenario(method="tide", rounds=1, **{"output.tensorboard": False,
                                                  "selection": {"name": "tide", "k": 5}}),
        tiny_scenario(rounds=1, faults={"actor_kill_prob": 0.3, "deadline_seconds": 5.0},
                      **{"output.tensorboard": False, "output.checkpoint_every": 1}),
        fm,
    ]


def paths(node: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(node, dict):
        for k, v in node.items():
            out += paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += paths(v, (*prefix, i))
    return out


def hostile_value(rng: random.Random, old: Any) -> Any:
    """A hostile value, often near the old one (bounds of the same type)."""
    if isinstance(old, (int, float)) and not isinstance(old, bool) and rng.random() < 0.4:
        return rng.choice([old * 10**rng.randint(1, 12), -old, old + 0.5, old - 1,
                           float(old), int(old) if math.isfinite(old) else 0, str(old)])
    return copy.deepcopy(rng.choice(HOSTILE))


def mutate(rng: random.Random, raw: dict[str, Any]) -> dict[str, Any]:
    raw = copy.deepcopy(raw)
    for _ in range(rng.randint(1, 4)):
        candidates = [p for p in paths(raw) if p]
        if not candidates:
            break
        path = rng.choice(candidates)
        parent: Any = raw
        for p in path[:-1]:
            parent = parent[p]
        key, old = path[-1], parent[path[-1]]
        action = rng.choice(["replace", "replace", "replace", "delete", "add", "rename",
                             "section", "list"])
        if action == "delete" and isinstance(parent, dict):
            del parent[key]
        elif action == "add" and isinstance(parent, dict):
            parent[rng.choice(["extra", "k", "name", "sensors", "fraction", "path", "Name",
                               "ñ", "1"])] = hostile_value(rng, None)
        elif action == "rename" and isinstance(parent, dict):
            parent[str(key) + rng.choice(["_", "s", " "])] = parent.pop(key)
        elif action == "section":
            raw[rng.choice(SECTIONS)] = hostile_value(rng, None)
        elif action == "list" and isinstance(old, list):
            parent[key] = rng.choice([[], old * 3, old[:1], [old]])
        else:
            parent[key] = hostile_value(rng, old)
    return raw


class Hang(Exception):
    pass


@contextlib.contextmanager
def alarm(seconds: int):
    def _raise(*_: Any) -> None:
        raise Hang

    previous = signal.signal(signal.SIGALRM, _raise)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def call(argv: list[str], seconds: int) -> tuple[int | str, str]:
    """(exit code or "hang"/"traceback", stderr) of `raymm ARGV` in this process."""
    from raymm.app.cli import main

    err, out = io.StringIO(), io.StringIO()
    try:
        with alarm(seconds), contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            rc: int | str = main(argv)
    except Hang:
        rc = "hang"
    except SystemExit as exc:  # argparse
        rc = exc.code if isinstance(exc.code, int) else 2
    except BaseException as exc:  # noqa: BLE001 - the thing being counted
        rc = "traceback"
        err.write(f"{type(exc).__name__}: {exc}")
    if "Traceback" in err.getvalue() + out.getvalue():
        rc = "traceback"
    return rc, err.getvalue()


def small_enough(raw: dict[str, Any]) -> bool:
    """Runs only what a test can afford: a validated scenario may ask for millions of devices
    (that is allowed, and validation already answered); one round of it is not a fuzz case."""
    pop = raw.get("population") if isinstance(raw.get("population"), dict) else {}
    data = raw.get("dataset") if isinstance(raw.get("dataset"), dict) else {}
    model = raw.get("model") if isinstance(raw.get("model"), dict) else {}
    dims = [v.get("dim", 1) * (v.get("length") or 1) for v in
            (data.get("sensors") or {}).values() if isinstance(v, dict)]
    numbers = [pop.get("devices", 20), data.get("n_train", 2000), data.get("n_test", 500),
               *dims, *(model.get(k, 64) for k in ("embed_dim", "hidden", "fusion_dim"))]
    return all(isinstance(n, int) and n <= 5000 for n in numbers)


def case(raw: dict[str, Any], workdir: Path, seconds: int = 120) -> str:
    """Outcome of one mutated scenario: "exit0", "exit2", "skipped_run" (valid but too big to
    run here), "traceback:...", "hang:..." or "leak:..." (files left where they must not be)."""
    workdir.mkdir(parents=True)
    path = workdir / "s.yaml"
    path.write_text(yaml.safe_dump(raw, allow_unicode=True))
    rc, err = call(["validate", str(path)], seconds)
    if rc not in (0, 2):
        return f"{rc}:validate:{err[-300:]}"
    if rc == 2:
        return "exit2" if err.startswith("raymm: ") else f"traceback:message:{err[-300:]}"
    if not small_enough(raw):
        return "skipped_run"
    out = workdir / "runs"
    rc, err = call(["run", str(path), "--executor", "serial", "--out", str(out),
                    "--no-progress", "--set", "rounds=1", "--set", "training.local_epochs=1"],
                   seconds)
    beside = sorted(p.name for p in workdir.iterdir())
    if rc not in (0, 2):
        return f"{rc}:run:{err[-300:]}"
    if beside not in (["s.yaml"], ["runs", "s.yaml"]):
        return f"leak:{beside}"
    if rc == 2 and out.exists() and any(out.iterdir()):
        # a run that started and then stopped (diverged, interrupted) keeps its directory
        if "training diverged" not in err:
            return f"leak:wrote after exit 2:{err[-200:]}"
    return "exit0" if rc == 0 else "exit2"


def strays(workdir: Path, home: Path) -> list[str]:
    """Anything in the campaign's folder other than the cases' own folders, and anything in the
    working directory the cases run from (a relative path, or a name that left --out)."""
    return sorted([p.name for p in workdir.iterdir()
                   if p != home and not (p.name[:1] == "c" and p.name[1:].isdigit())]
                  + [f"cwd/{p.name}" for p in home.iterdir()])


def campaign(cases: int, seed: int, workdir: Path) -> dict[str, Any]:
    rng = random.Random(seed)
    bases = base_scenarios()
    tally: dict[str, Any] = {"cases": 0, "exit0": 0, "exit2": 0, "skipped_run": 0,
                             "tracebacks": 0, "hangs": 0, "leaks": 0,
                             "slowest_case_seconds": 0.0, "failures": []}
    home = workdir / "cwd"
    home.mkdir()
    previous = os.getcwd()
    os.chdir(home)
    t0 = time.perf_counter()
    try:
        for i in range(cases):
            t = time.perf_counter()
            outcome = case(mutate(rng, rng.choice(bases)), workdir / f"c{i}")
            tally["slowest_case_seconds"] = max(tally["slowest_case_seconds"],
                                                round(time.perf_counter() - t, 1))
            if outcome.split(":")[0] in ("exit0", "exit2", "skipped_run") and \
                    (stray := strays(workdir, home)):
                outcome = f"leak:outside the case's folder: {stray}"
            tally["cases"] += 1
            kind = outcome.split(":")[0]
            if kind in ("exit0", "exit2", "skipped_run"):
                tally[kind] += 1
            else:
                tally[{"hang": "hangs", "leak": "leaks"}.get(kind, "tracebacks")] += 1
                tally["failures"].append(f"case {i}: {outcome}")
    finally:
        os.chdir(previous)
    tally["seconds"] = round(time.perf_counter() - t0, 1)
    return tally


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cases", type=int, default=500)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        print(json.dumps(campaign(args.cases, args.seed, Path(tmp)), indent=2))


if __name__ == "__main__":
    main()
