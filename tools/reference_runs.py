"""Fingerprints of a fixed set of short runs: the final weights' SHA-256 and every round's loss.

A refactor or a speed-up that claims "same numbers" runs this before and after and compares the
two JSON files; any difference in any run's weights or any round's loss is a change of numbers.
The set covers the lock-step path (the standard bench at two sizes, Adam and momentum over two
epochs, weight decay, a proximal term, the multimodal stress scenarios, FedAvg on TIDE's HAR
setup) and both flagship methods on each executor.

    python tools/reference_runs.py --out /tmp/after.json
    python tools/reference_runs.py --compare /tmp/before.json /tmp/after.json

The TIDE and FedMChain runs read real data from `RAYMM_DATA`; without it they are left out (and
the file says so). The runs are strict about lock-step training (`RAYMM_STRICT_LOCKSTEP=1`,
unless set otherwise): a lock-step program that falls back to the sequential path stops the
run, since its fingerprint would then be the sequential path's.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

BENCH = "scenarios/bench/standard.yaml"
LOCKSTEP = ["execution.training.path=lockstep", "rounds=3"]
SEQUENTIAL = "execution.training.path=sequential"
SHORT = ["rounds=4", "eval.every=2"]

#: name -> (scenario, overrides, needs real data)
RUNS: dict[str, tuple[str, list[str], bool]] = {
    "bench_1k": (BENCH, LOCKSTEP, False),
    "bench_5k": (BENCH, [*LOCKSTEP, "dataset.clients=5000", "population.devices=5000",
                         "selection.k=500"], False),
    "bench_adam_2ep": (BENCH, [*LOCKSTEP, "training.optimizer=adam", "training.lr=0.01",
                               "training.local_epochs=2"], False),
    "bench_momentum_2ep": (BENCH, [*LOCKSTEP, "training.momentum=0.9",
                                   "training.local_epochs=2"], False),
    "bench_weight_decay": (BENCH, [*LOCKSTEP, "training.weight_decay=0.01"], False),
    "bench_fedprox": (BENCH, [*LOCKSTEP, "objective.mu=0.1"], False),
    "stress_10k": ("tools/stress/devices_10k.yaml", ["rounds=2", "execution.executor=serial"],
                   False),
    "stress_10k_tide": ("experiments/adaptive/devices_10k_tide.yaml",
                        ["rounds=4", "execution.executor=serial"], False),
    # the sequential path (pinned: lock-step is the default since issue 34)
    "tide_har_serial": ("scenarios/tide_har.yaml",
                        [*SHORT, "execution.executor=serial", SEQUENTIAL], True),
    "tide_har_ray": ("scenarios/tide_har.yaml",
                     [*SHORT, "execution.executor=ray", SEQUENTIAL], True),
    "fedmchain_serial": ("scenarios/fedmchain_avdigits_imbalanced.yaml",
                         [*SHORT, "execution.executor=serial", SEQUENTIAL], True),
    "fedmchain_ray": ("scenarios/fedmchain_avdigits_imbalanced.yaml",
                      [*SHORT, "execution.executor=ray", SEQUENTIAL], True),
    # the same on the lock-step path (the default where a scenario does not pin it)
    "tide_har_lockstep_serial": ("scenarios/tide_har.yaml",
                                 [*SHORT, "execution.executor=serial", LOCKSTEP[0]], True),
    "tide_har_lockstep_ray": ("scenarios/tide_har.yaml",
                              [*SHORT, "execution.executor=ray", LOCKSTEP[0]], True),
    # a baseline of the TIDE table: the `ce` objective in lock-step through the model's loss
    "tide_har_fedavg_lockstep_serial": ("scenarios/tide_har_fedavg.yaml",
                                        [*SHORT, "execution.executor=serial", LOCKSTEP[0]],
                                        True),
    "fedmchain_lockstep_serial": ("scenarios/fedmchain_avdigits_imbalanced.yaml",
                                  [*SHORT, "execution.executor=serial", LOCKSTEP[0]], True),
    "fedmchain_lockstep_ray": ("scenarios/fedmchain_avdigits_imbalanced.yaml",
                               [*SHORT, "execution.executor=ray", LOCKSTEP[0]], True),
}


def fingerprint(params: dict[str, np.ndarray]) -> str:
    """SHA-256 over the groups' names and float32 bytes, in name order."""
    h = hashlib.sha256()
    for g in sorted(params):
        h.update(g.encode())
        h.update(np.ascontiguousarray(params[g], np.float32).tobytes())
    return h.hexdigest()


def run_all(names: list[str]) -> dict[str, object]:
    import raymm

    out: dict[str, object] = {}
    have_data = bool(os.environ.get("RAYMM_DATA"))
    # before any Ray starts, so that its workers inherit it
    # (`raymm.training.lockstep.fallback.strict`)
    os.environ.setdefault("RAYMM_STRICT_LOCKSTEP", "1")
    for name in names:
        scenario, overrides, needs_data = RUNS[name]
        if needs_data and not have_data:
            out[name] = "skipped: RAYMM_DATA is not set"
            continue
        with tempfile.TemporaryDirectory() as tmp:
            res = raymm.run(scenario, [*overrides, "output.tensorboard=false"], out=tmp)
        losses = [r.get("train_loss") for r in res.rows]
        out[name] = {"params_sha256": fingerprint(res.params),
                     "losses": [None if v is None else float(v).hex() for v in losses],
                     "accuracy": [r.get("accuracy") for r in res.rows]}
        print(f"{name}: {out[name]['params_sha256'][:16]}", file=sys.stderr)  # type: ignore[index]
    return out


def compare(a: dict[str, object], b: dict[str, object]) -> list[str]:
    """Names of the runs whose fingerprints differ (or are missing on one side)."""
    return [n for n in sorted(set(a) | set(b)) if a.get(n) != b.get(n)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--only", nargs="*", choices=sorted(RUNS), help="a subset of the runs")
    ap.add_argument("--compare", nargs=2, type=Path, metavar=("BEFORE", "AFTER"))
    args = ap.parse_args()
    if args.compare:
        a, b = (json.loads(p.read_text()) for p in args.compare)
        diff = compare(a, b)
        for n in sorted(set(a) | set(b)):
            state = ("only in BEFORE" if n not in b else "only in AFTER" if n not in a
                     else "DIFFERS" if n in diff else "same")
            print(f"{n}: {state}")
        return 1 if diff else 0
    result = run_all(args.only or list(RUNS))
    text = json.dumps(result, indent=1)
    if args.out:
        args.out.write_text(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
