"""How many devices each lock-step configuration hands back to sequential training.

    python tools/lockstep_fallbacks.py                 # every configuration
    python tools/lockstep_fallbacks.py --objectives tide --encoders cnn1d

runs a tiny synthetic scenario (12 devices, 5 selected, 3 rounds, serial executor) in lock-step
for every lock-step objective x local optimizer x proximal term x sensor mix (two sensors, every
device with both, or with the first only, or three tiers; or a dataset of one sensor) x
encoder, and
prints, per configuration, the devices whose lock-step program raised and that then trained
sequentially, summed over the rounds. It counts the lock-step trainer's warnings ("lock-step
training of N device(s) failed"; "vectorised" before the rename), so it measures any checkout,
also one from before the trainer counted fallbacks itself (`PYTHONPATH=/path/to/checkout`);
strict mode (`RAYMM_STRICT_LOCKSTEP`) is switched off here, so a fallback is counted, not raised.
`tests/unit/training/lockstep/test_fallback.py` runs the same configurations (`scenario`)
against the sequential path and asserts that none falls back.
"""

from __future__ import annotations

import argparse
import itertools
import logging
import os
import re
import sys
import tempfile
from typing import Any

OBJECTIVES = ("ce", "tide", "mcft", "adaptive_prox")
OPTIMIZERS = ("sgd", "momentum", "adam")
MIXES = ("full", "one", "mixed", "single")
ENCODERS = ("mlp", "cnn1d")
FAILED = re.compile(r"(?:vectorised|lock-step) training of (\d+) device\(s\) failed \((\w+)")

#: sensor mix -> the population's tiers (12 devices)
TIERS: dict[str, list[dict[str, Any]]] = {
    "full": [{"sensors": ["a", "b"], "count": 12}],
    "one": [{"sensors": ["a"], "count": 12}],
    "mixed": [{"sensors": ["a", "b"], "count": 4}, {"sensors": ["a"], "count": 4},
              {"sensors": ["b"], "count": 4}],
    "single": [{"sensors": ["a"], "count": 12}],
}


def scenario(objective: str, optimizer: str, prox: bool, mix: str, encoder: str,
             rounds: int = 3) -> dict[str, Any]:
    """The tiny scenario of one configuration (batch 7: padded last minibatches)."""
    length = {"length": 32} if encoder == "cnn1d" else {}
    sensors = {"a": {"dim": 3, "informativeness": 1.0, **length},
               "b": {"dim": 2, "informativeness": 0.5, **length}}
    if mix == "single":   # a dataset of one sensor: the bench's chain of `Linear` layers
        del sensors["b"]
    sc: dict[str, Any] = {
        "name": "fallbacks", "seed": 7, "rounds": rounds, "method": "fedavg",
        "dataset": {"name": "synthetic", "n_train": 400, "n_test": 100, "classes": 4,
                    "sensors": sensors},
        "population": {"devices": 12, "tiers": TIERS[mix],
                       "partition": {"kind": "dirichlet", "alpha": 1.0, "min_samples": 5}},
        "model": {"encoder": encoder, "embed_dim": 8, "hidden": 16, "fusion_dim": 16},
        # Adam at TIDE's 1e-3: where a gradient is near zero, Adam turns float32 rounding into
        # a step of up to the learning rate, and lock-step Adam rounds otherwise
        "training": {"local_epochs": 1, "batch_size": 7,
                     "lr": 0.001 if optimizer == "adam" else 0.01,
                     "optimizer": "adam" if optimizer == "adam" else "sgd",
                     "momentum": 0.9 if optimizer == "momentum" else 0.0},
        "selection": {"name": "random", "k": 5},
        "eval": {"every": 1000},
        "execution": {"executor": "serial"},
        "output": {"tensorboard": False},
    }
    mu = 0.5 if prox else 0.0
    if objective == "ce":
        sc["objective"] = {"name": "ce", "mu": mu}
    elif objective == "tide":
        sc.update(method="tide", aggregation={"name": "tide", "warmup": 1},
                  objective={"name": "tide", "mu": mu})
        sc["training"].update(upload="held")
    elif objective == "mcft":
        sc["method"] = "fedmchain"
        sc["population"]["local_test_fraction"] = 0.2
        sc["training"].update(sync_every=2)
    else:
        sc["aggregation"] = {"name": "adaptive_prox", "mu": mu, "max_mu": mu}
        sc["objective"] = {"name": "adaptive_prox"}
    return sc


class Count(logging.Handler):
    """Devices of the lock-step programs that failed, and why (the exception's type)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.devices = 0
        self.why: set[str] = set()

    def emit(self, record: logging.LogRecord) -> None:
        m = FAILED.search(record.getMessage())
        if m:
            self.devices += int(m.group(1))
            self.why.add(m.group(2))


def count(sc: dict[str, Any]) -> tuple[int, set[str]]:
    from raymm.app.api import run
    from raymm.app.build import load_scenario

    handler = Count()
    log = logging.getLogger("raymm.training.lockstep")
    log.addHandler(handler)
    try:
        with tempfile.TemporaryDirectory() as out:
            run(load_scenario(sc), out=out)
    finally:
        log.removeHandler(handler)
    return handler.devices, handler.why


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for name, choices in [("objectives", OBJECTIVES), ("optimizers", OPTIMIZERS),
                          ("mixes", MIXES), ("encoders", ENCODERS)]:
        p.add_argument(f"--{name}", default=",".join(choices),
                       help=f"comma-separated, of {','.join(choices)}")
    args = p.parse_args()
    os.environ["RAYMM_STRICT_LOCKSTEP"] = "0"
    logging.getLogger("raymm.training.lockstep").propagate = False   # counted, not printed
    pick = {k: getattr(args, k).split(",") for k in ("objectives", "optimizers", "mixes",
                                                       "encoders")}
    total = 0
    print(f"{'objective':14s} {'optimizer':9s} {'prox':4s} {'mix':6s} {'encoder':7s} "
          "fallbacks (devices, 3 rounds)")
    for obj, opt, prox, mix, enc in itertools.product(
            pick["objectives"], pick["optimizers"], (False, True), pick["mixes"],
            pick["encoders"]):
        if prox and obj == "mcft":
            continue   # MCFT has no proximal term
        devices, why = count(scenario(obj, opt, prox, mix, enc))
        total += devices
        print(f"{obj:14s} {opt:9s} {'on' if prox else 'off':4s} {mix:6s} {enc:7s} {devices:3d} "
              f"{','.join(sorted(why))}", flush=True)
    print(f"total: {total}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
