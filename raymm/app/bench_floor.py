"""The arithmetic floor of a `raymm bench` round: its matrix products alone, on this machine.

A lock-step round of the standard workload (docs/workload.md) trains K devices' copies of the
`Linear(D, H) -> ReLU -> Linear(H, C)` MLP for E epochs of ceil(S / B) minibatches. Each
minibatch step is five batched matrix products over the K devices: the two layers forward,
the second layer's input gradient and both weight gradients (the first layer needs no input
gradient). Nearly all of the round's floating-point work is there, so their time on one
thread is what a round cannot go below on one core, whatever else a simulator does: `raymm
bench` prints it next to the measured rounds, as seconds and as a share of the bare loop's
round. Two DeviceActors on two cores split it between them.
"""

from __future__ import annotations

import math
import time

import torch


def step_products(k: int, d: int, h: int, c: int, b: int) -> list[tuple[tuple[int, ...], ...]]:
    """The ([G, m, n], [G, n, p]) operand shapes of one lock-step minibatch step, each
    weight gradient in the weight's own [out, in] orientation, as the closed-form step takes
    it (`raymm.training.lockstep.closed_form`), the faster orientation for a layer of few outputs
    (docs/performance.md, "Smaller mechanisms")."""
    return [((k, b, d), (k, d, h)),   # layer 1 forward
            ((k, b, h), (k, h, c)),   # layer 2 forward
            ((k, b, c), (k, c, h)),   # layer 2's input gradient
            ((k, c, b), (k, b, h)),   # layer 2's weight gradient
            ((k, h, b), (k, b, d))]   # layer 1's weight gradient


def round_steps(s: int, b: int, epochs: int) -> int:
    """Minibatch steps of one device's round: E epochs of ceil(S / B)."""
    return epochs * math.ceil(s / b)


def round_flops(k: int, d: int, h: int, c: int, s: int, b: int, epochs: int) -> int:
    """Floating-point operations of one round's matrix products (2 per multiply-add)."""
    per_step = sum(2 * x[0] * x[1] * x[2] * y[2] for x, y in step_products(k, d, h, c, b))
    return round_steps(s, b, epochs) * per_step


def matmul_floor(k: int, d: int, h: int, c: int, s: int, b: int, epochs: int,
                 repeat: int = 3, seed: int = 0) -> float:
    """Seconds one thread takes for one round's matrix products (`torch.bmm` on contiguous
    operands of the round's shapes; fastest of `repeat`)."""
    g = torch.Generator().manual_seed(seed)
    shapes = step_products(k, d, h, c, b)
    operands = [(torch.randn(x, generator=g), torch.randn(y, generator=g)) for x, y in shapes]
    outs = [torch.empty(x[0], x[1], y[2]) for x, y in shapes]
    steps = round_steps(s, b, epochs)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for (x, y), out in zip(operands, outs):   # warm the kernels and the pages
            torch.bmm(x, y, out=out)
        best = math.inf
        for _ in range(repeat):
            start = time.perf_counter()
            for _ in range(steps):
                for (x, y), out in zip(operands, outs):
                    torch.bmm(x, y, out=out)
            best = min(best, time.perf_counter() - start)
    finally:
        torch.set_num_threads(threads)
    return best
