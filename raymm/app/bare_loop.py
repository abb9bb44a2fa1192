"""The standard workload as one plain process: raymm's yardstick for `raymm bench`.

Run as `python -m raymm.app.bare_loop [--clients N --per-round K --rounds R ...]`. It implements
the workload of docs/workload.md with numpy and torch only (nothing of raymm, no framework):
clients are trained one after the other in this process with one torch thread, so its seconds
per round are what the work itself costs on one core. Any simulator running the same workload
adds its overhead to that, or divides it by the cores it uses.

The workload is specified so that every faithful implementation ends with the same float32
weights, bit for bit, for the same arguments: the last line printed is `RESULT {json}`, and its
`weights_sha` (the first 16 hex digits of the SHA-256 of the parameters' float32 bytes, in the
model's parameter order) lets two implementations be compared exactly, not only by accuracy.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import resource
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

#: the per-client permutation seed: ((seed * A + round) * B + client), as docs/workload.md fixes
PERM_A, PERM_B = 1_000_003, 1_000_033


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m raymm.app.bare_loop",
        description="The standard FL workload (docs/workload.md) in one process, no framework.")
    arg = p.add_argument
    arg("--clients", type=int, default=1000, help="N: clients in all")
    arg("--per-round", type=int, default=100, help="K: clients drawn per round")
    arg("--rounds", type=int, default=5, help="R: rounds")
    arg("--epochs", type=int, default=1, help="E: local epochs")
    arg("--samples-per-client", type=int, default=64, help="S: samples each client holds")
    arg("--dim", type=int, default=64, help="D: input features")
    arg("--classes", type=int, default=6, help="C: classes")
    arg("--hidden", type=int, default=64, help="H: hidden width of the MLP")
    arg("--batch-size", type=int, default=32, help="B: local minibatch size")
    arg("--lr", type=float, default=0.1, help="learning rate of plain local SGD")
    arg("--noise", type=float, default=3.0, help="std of the Gaussian feature noise")
    arg("--alpha", type=float, default=0.5, help="Dirichlet alpha of a client's label mix")
    arg("--test-samples", type=int, default=2000, help="size of the central test set")
    arg("--seed", type=int, default=0, help="every random draw derives from it")
    arg("--threads", type=int, default=1, help="torch intra-op threads")
    arg("--eval-every-round", action="store_true", help="evaluate after every round too")
    return p


def class_means(cfg: argparse.Namespace) -> np.ndarray:
    """[C, D] float32 class centres, from the stream (seed, 0)."""
    rng = np.random.default_rng([cfg.seed, 0])
    return rng.normal(0.0, 1.0, size=(cfg.classes, cfg.dim)).astype(np.float32)


def client_data(cid: int, cfg: argparse.Namespace,
                mu: np.ndarray | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Client `cid`'s S samples, regenerated on every call from the stream (seed, 1, cid): a
    Dirichlet label mix, S labels drawn from it, then each sample its class centre plus noise."""
    mu = class_means(cfg) if mu is None else mu
    rng = np.random.default_rng([cfg.seed, 1, cid])
    mix = rng.dirichlet(np.full(cfg.classes, cfg.alpha))
    y = rng.choice(cfg.classes, size=cfg.samples_per_client, p=mix)
    noise = rng.normal(0.0, cfg.noise, size=(cfg.samples_per_client, cfg.dim))
    x = mu[y] + noise.astype(np.float32)
    return torch.from_numpy(x), torch.from_numpy(y.astype(np.int64))


def test_data(cfg: argparse.Namespace,
              mu: np.ndarray | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The central test set from the stream (seed, 2): uniform labels, centre plus noise."""
    mu = class_means(cfg) if mu is None else mu
    rng = np.random.default_rng([cfg.seed, 2])
    y = rng.integers(0, cfg.classes, size=cfg.test_samples)
    noise = rng.normal(0.0, cfg.noise, size=(cfg.test_samples, cfg.dim))
    x = mu[y] + noise.astype(np.float32)
    return torch.from_numpy(x), torch.from_numpy(y.astype(np.int64))


def build_model(cfg: argparse.Namespace) -> nn.Sequential:
    """Linear(D, H) -> ReLU -> Linear(H, C), initialised by torch's defaults under the seed."""
    torch.manual_seed(cfg.seed)
    return nn.Sequential(nn.Linear(cfg.dim, cfg.hidden), nn.ReLU(),
                         nn.Linear(cfg.hidden, cfg.classes))


def flat_weights(model: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def model_with(weights: Sequence[torch.Tensor], cfg: argparse.Namespace) -> nn.Sequential:
    """A fresh model holding `weights` (as the workload has it: nothing carries over between
    clients but the global weights)."""
    model = build_model(cfg)
    with torch.no_grad():
        for p, w in zip(model.parameters(), weights):
            p.copy_(w)
    return model


def local_update(weights: Sequence[torch.Tensor], x: torch.Tensor, y: torch.Tensor, cid: int,
                 rnd: int, cfg: argparse.Namespace) -> tuple[list[torch.Tensor], float]:
    """A fresh model from the global `weights`, E epochs of minibatch SGD in the order of a
    seeded permutation per epoch; returns the new weights and the mean minibatch loss."""
    model = model_with(weights, cfg)
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr)
    gen = torch.Generator().manual_seed((cfg.seed * PERM_A + rnd) * PERM_B + cid)
    losses = []
    for _ in range(cfg.epochs):
        order = torch.randperm(len(y), generator=gen)
        for start in range(0, len(y), cfg.batch_size):
            idx = order[start:start + cfg.batch_size]
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x[idx]), y[idx])
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
    return flat_weights(model), sum(losses) / max(len(losses), 1)


def fedavg(updates: Sequence[tuple[int, list[torch.Tensor]]]) -> list[torch.Tensor]:
    """Example-weighted mean of (samples, weights) pairs in float64, cast back to float32.

    Each client's weights enter multiplied by its share of the examples, n / total (a float64
    scalar), and the terms are added in the order given (ascending client id). Summing n * w
    and dividing at the end is the same mean but rounds differently; the share form is the one
    every implementation of the workload uses, so their weights agree bit for bit."""
    total = float(sum(n for n, _ in updates))
    sums = [torch.zeros_like(w, dtype=torch.float64) for w in updates[0][1]]
    for n, ws in updates:
        for s, w in zip(sums, ws):
            s += w.double() * (n / total)
    return [s.float() for s in sums]


def evaluate(weights: Sequence[torch.Tensor], x: torch.Tensor, y: torch.Tensor,
             cfg: argparse.Namespace) -> tuple[float, float]:
    """(accuracy, mean cross-entropy) of `weights` on the test set."""
    model = model_with(weights, cfg)
    with torch.no_grad():
        logits = model(x)
        return (float((logits.argmax(1) == y).float().mean()),
                float(nn.functional.cross_entropy(logits, y)))


def weights_sha(weights: Sequence[torch.Tensor]) -> str:
    digest = hashlib.sha256()
    for w in weights:
        digest.update(w.contiguous().numpy().astype(np.float32).tobytes())
    return digest.hexdigest()[:16]


def run(cfg: argparse.Namespace) -> dict[str, Any]:
    """The whole workload; returns the RESULT record (see docs/workload.md, "Output")."""
    t0 = time.perf_counter()
    torch.set_num_threads(cfg.threads)
    mu = class_means(cfg)
    x_test, y_test = test_data(cfg, mu)
    weights = flat_weights(build_model(cfg))
    initial_acc, _ = evaluate(weights, x_test, y_test, cfg)
    pick = np.random.default_rng([cfg.seed, 3])
    round_seconds = []
    first = time.perf_counter()
    for rnd in range(1, cfg.rounds + 1):
        start = time.perf_counter()
        chosen = np.sort(pick.choice(cfg.clients, cfg.per_round, replace=False))
        updates, losses = [], []
        for cid in chosen.tolist():
            x, y = client_data(cid, cfg)  # regenerated each time: clients keep no state
            new, loss = local_update(weights, x, y, cid, rnd, cfg)
            updates.append((len(y), new))
            losses.append(loss)
        weights = fedavg(updates)
        round_seconds.append(time.perf_counter() - start)
        row: dict[str, Any] = {"round": rnd, "seconds": round(round_seconds[-1], 4),
                               "train_loss": round(sum(losses) / len(losses), 5)}
        if cfg.eval_every_round:
            row["test_acc"], row["test_loss"] = evaluate(weights, x_test, y_test, cfg)
        print(f"round {rnd}: {row}", flush=True)
    rounds_s = time.perf_counter() - first
    final_acc, final_loss = evaluate(weights, x_test, y_test, cfg)
    steady = round_seconds[1:]
    return {
        "impl": "raymm.app.bare_loop", **{k: getattr(cfg, k) for k in (
            "clients", "per_round", "rounds", "epochs", "samples_per_client", "dim", "classes",
            "hidden", "batch_size", "lr", "seed", "threads")},
        "initial_acc": round(initial_acc, 4), "final_acc": round(final_acc, 4),
        "final_loss": round(final_loss, 4), "rounds_s": round(rounds_s, 3),
        "rounds_per_s": round(cfg.rounds / rounds_s, 3),
        "client_updates_per_s": round(cfg.rounds * cfg.per_round / rounds_s, 1),
        "steady_rounds_per_s": round(len(steady) / sum(steady), 3) if steady else None,
        "round_seconds": [round(s, 4) for s in round_seconds],
        "total_s": round(time.perf_counter() - t0, 3),
        # ru_maxrss is in KiB on Linux
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "weights_sha": weights_sha(weights), "torch": torch.__version__,
    }


def main(argv: Sequence[str] | None = None) -> int:
    cfg = build_parser().parse_args(argv)
    if not 1 <= cfg.per_round <= cfg.clients:
        raise SystemExit("bare_loop: --per-round must be between 1 and --clients")
    res = run(cfg)
    print(f"bare loop: {cfg.rounds} rounds in {res['rounds_s']}s, acc {res['initial_acc']} -> "
          f"{res['final_acc']}, weights {res['weights_sha']}")
    print("RESULT " + json.dumps(res), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
