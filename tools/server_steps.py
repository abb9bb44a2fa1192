"""Server steps at paper-scale model sizes: seconds and memory bandwidth, printed as a table.

Times, on synthetic updates of the given sizes (fastest of --repeat runs, after one warm-up):
- SSCA (`ssca_step`: sparsify, sign clustering, consensus, merge, coherent update) for
  senders × parameters, e.g. 100 × 1M and 50 × 11M (ResNet-18 size);
- FedAvg's weighted mean (`UpdateBatch.weighted_mean`, the canonical block order every
  combinable aggregator uses) and TIDE's merge (the same mean with evidence weights) over the
  same rows;
- TIDE's prototype update for senders × classes × fusion width.
GB/s is the bytes of the update rows read once over the step's time: the floor every step pays.

    python tools/server_steps.py [--sizes 100x1000000 50x11000000] [--repeat 3]
                                           [--ssca-threads N]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np

from policies.aggregation import ssca
from policies.aggregation.ssca import SSCAParams, ssca_step
from policies.aggregation.tide import evidence_weights, update_prototypes
from raymm.protocol.messages import UpdateBatch


def _fastest(fn: Callable[[], object], repeat: int) -> float:
    fn()   # warm-up: imports, first-touch pages
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _batch(rows: np.ndarray, samples: np.ndarray) -> UpdateBatch:
    n = rows.shape[0]
    return UpdateBatch(np.arange(n), samples, np.zeros(n), np.zeros(n), {"g": rows},
                       {"g": np.arange(n)}, {}, np.zeros(0, np.int64), ())


def bench(n: int, p: int, repeat: int) -> list[tuple[str, str, float, float]]:
    rng = np.random.default_rng(0)
    # clustered deltas: 5 directions plus noise, as SSCA sees after local training
    protos = rng.standard_normal((5, p), dtype=np.float32)
    rows = protos[rng.integers(0, 5, n)]
    rows += rng.standard_normal((n, p), dtype=np.float32)
    samples = rng.integers(10, 100, n)
    weights = samples.astype(np.float64)
    models = np.zeros((5, p), np.float32)
    previous = rng.integers(0, 5, n)
    gb = rows.nbytes / 1e9
    size = f"{n} × {p:,}"
    out = []
    t = _fastest(lambda: ssca_step(rows, weights, models, previous, SSCAParams(), 0), repeat)
    out.append(("SSCA step", size, t, gb / t))
    batch = _batch(rows, samples)
    t = _fastest(lambda: batch.weighted_mean("g"), repeat)
    out.append(("FedAvg weighted mean", size, t, gb / t))
    ev = evidence_weights(samples, rng.random(n), 1.0)
    t = _fastest(lambda: batch.weighted_mean("g", ev), repeat)
    out.append(("TIDE merge (evidence weights)", size, t, gb / t))
    return out


def bench_prototypes(n: int, classes: int, width: int, repeat: int
                     ) -> tuple[str, str, float, float]:
    rng = np.random.default_rng(1)
    means = rng.standard_normal((n, classes, width)).astype(np.float32)
    counts = rng.integers(0, 20, (n, classes))
    t = _fastest(lambda: update_prototypes(None, None, means, counts, 0.5), repeat)
    return ("TIDE prototypes", f"{n} × {classes} × {width}", t, means.nbytes / 1e9 / t)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", nargs="+", default=["100x1000000", "50x11000000"],
                    help="senders x parameters")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--ssca-threads", type=int, default=ssca.THREADS,
                    help=f"threads of the SSCA step (default {ssca.THREADS}: this machine's cores)")
    args = ap.parse_args()
    if args.ssca_threads < 1:
        ap.error("--ssca-threads: at least 1")
    ssca.THREADS = args.ssca_threads
    rows = []
    for size in args.sizes:
        try:
            n, p = (int(v) for v in size.lower().split("x"))
        except ValueError:
            ap.error(f"--sizes: {size!r} is not SENDERSxPARAMETERS (e.g. 100x1000000)")
        rows += bench(n, p, args.repeat)
    rows.append(bench_prototypes(1000, 28, 512, args.repeat))
    print("| step | size | seconds | GB/s |\n|---|---|---|---|")
    for name, size, t, bw in rows:
        print(f"| {name} | {size} | {t:.3f} | {bw:.1f} |")


if __name__ == "__main__":
    main()
