"""Adam for a lock-step program: every device's parameters, moments and gradients in one
buffer each, stepped by torch's fused Adam kernel.

`raymm.training.local_update.FunctionalOptimizer` replays torch.optim.Adam's multi-tensor
operations, seven passes over memory per step, and on a lock-step program's stacks that step is
memory-bound (docs/performance.md, "Adam on stacked rows"). Here a program's
trainable parameters live in one float32 buffer `[G, P]` (device-major: a device's parameters
are one row, each parameter a strided `[G, *shape]` view of it), so does each moment, and a
step copies the gradients into a buffer alike and makes one `torch._fused_adam_` call (the
kernel of `torch.optim.Adam(fused=True)`) per run of devices that took the same number of steps.

The same algorithm as torch.optim.Adam, not its operation order: the fused kernel rounds the
parameter update differently from the multi-tensor one (in the last bit of a few values),
so a lock-step run under Adam is not bit-identical to the sequential path (it never was: batched
matrix products sum in another order). A device's numbers still do not depend on which devices
share its program: the kernel computes a value with its vector instructions except in a tail
shorter than a vector, whose scalar code rounds otherwise, and a row of `P` -- a multiple of
`ROW_ALIGN` floats -- leaves no tail for a run of whole rows (measured: 1-60 devices, rows of
64-38,400 floats, one and two threads; `tests/unit/training/_kernels/test_lockstep_adam.py`).

Set aside (`raymm.training.local_update`, a device without a minibatch in a step): a step covers
rows `[:k]` only, so the rows after them stay as they were, with no copying. Per-device step
counts give per-device bias corrections: a device's count, kept here, picks its run's `step`.
A parameter the loss does not use gets no gradient in any step of a program (its structure is
fixed): its gradient stays zero, which leaves it and its moments exactly as they were (zero
moments, `p - lr * 0 / eps`), as torch.optim skips it; under weight decay its values are put
back after the step. One that gets a gradient in some steps only is refused (the bucket then
trains sequentially).

An objective's proximal term c * ||θ - θ_start||² over some of the parameters
(`Objective.proximal`) is added here rather than in the loss: its gradient 2c(θ - θ_start) goes
onto the copied gradients' columns of those parameters (one contiguous span when they sort
together) and its value is returned per device. That is 4 operations a step where autograd ran
a subtraction, a square and a sum per parameter forward, and as many backward: a round of
`scenarios/tide_har.yaml` (26 parameters) took 0.92 of its time before. The same term, summed
in another order: other last bits than the loss's own.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping

import torch
from torch import Tensor

from raymm.phases import phase

#: floats per device row: a multiple of every CPU vector width (AVX-512: 16 floats)
ROW_ALIGN = 64

Params = dict[str, Tensor]


class LockstepAdam:
    """One lock-step program's parameters and Adam state (see the module docstring)."""

    def __init__(self, params: Params, lr: float, betas: tuple[float, float], eps: float,
                 weight_decay: float, grad_sum: bool,
                 proximal: tuple[float, tuple[str, ...]] = (0.0, ())) -> None:
        first = next(iter(params.values()))
        g, dev = first.shape[0], first.device
        self.lr, self.betas, self.eps, self.weight_decay = lr, betas, eps, weight_decay
        self.names = list(params)
        self.shapes = {n: tuple(p.shape[1:]) for n, p in params.items()}
        self.spans: dict[str, tuple[int, int]] = {}
        end = 0
        for n, p in params.items():
            size = p[0].numel()
            self.spans[n] = (end, end + size)
            end += size
        width = -(-end // ROW_ALIGN) * ROW_ALIGN
        self.p = torch.zeros((g, width), dtype=torch.float32, device=dev)
        for n, p in params.items():
            self._view(self.p, n, g).copy_(p)
        self.m, self.v, self.g = (torch.zeros_like(self.p) for _ in range(3))
        #: the proximal term's coefficient c, and its column spans, each with the start
        #: values of its columns
        self.prox, names = proximal
        self.prox_spans = [(a, b, self.p[:, a:b].clone())
                           for a, b in _merged([self.spans[n] for n in names])] \
            if self.prox > 0 else []
        self.sum = torch.zeros_like(self.p) if grad_sum else None
        self.count = [0] * g   # each device's steps so far
        #: per parameter: whether it got a gradient (fixed after the first step)
        self.used: dict[str, bool] = {}
        #: (buffer, k) -> every parameter's view of the buffer's first k rows
        self._views: dict[tuple[int, int], Params] = {}

    def _view(self, buf: Tensor, name: str, k: int) -> Tensor:
        a, b = self.spans[name]
        return buf[:k, a:b].view((k,) + self.shapes[name])

    def _views_of(self, buf: Tensor, k: int) -> Params:
        key = (id(buf), k)
        if key not in self._views:
            self._views[key] = {n: self._view(buf, n, k) for n in self.names}
        return self._views[key]

    def params(self, k: int | None = None) -> Params:
        """The first k devices' parameters (all with None), as views of the buffer."""
        return dict(self._views_of(self.p, self.p.shape[0] if k is None else k))

    def grad_sums(self) -> Params | None:
        """Every device's summed gradients (None unless asked for); zeros for a parameter the
        loss never used."""
        if self.sum is None:
            return None
        every = self._views_of(self.sum, self.sum.shape[0])
        return {n: v for n, v in every.items() if self.used.get(n)}

    @phase("optimizer.step.lockstep_adam")
    def step(self, grads: Mapping[str, Tensor | None], k: int) -> Tensor | None:
        """One Adam step of the first k devices (in place); the proximal term's value per
        device [k] before the step (None without one)."""
        unused = []
        into = self._views_of(self.g, k)
        for n in self.names:
            g = grads.get(n)
            if self.used.setdefault(n, g is not None) != (g is not None):
                raise ValueError(f"parameter {n} got a gradient in some steps of a lock-step "
                                 "program only")
            if g is None:
                unused.append(n)
            else:
                into[n].copy_(g)
        prox = self._proximal(k)
        bufs = (self.p, self.m, self.v)
        kept = ([(n, [self._views_of(b, k)[n].clone() for b in bufs]) for n in unused]
                if self.weight_decay else [])
        for i in range(k):
            self.count[i] += 1
        b1, b2 = self.betas
        start = 0
        # runs of devices with the same count (counts fall along the rows)
        for count, run in itertools.groupby(self.count[:k]):
            rows = slice(start, start + len(list(run)))
            step = torch.tensor(float(count), device=self.p.device)
            torch._fused_adam_([self.p[rows]], [self.g[rows]], [self.m[rows]], [self.v[rows]],
                               [], [step], lr=self.lr, beta1=b1, beta2=b2,
                               weight_decay=self.weight_decay, eps=self.eps, amsgrad=False,
                               maximize=False)
            start = rows.stop
        for n, olds in kept:
            for buf, old in zip(bufs, olds):
                self._views_of(buf, k)[n].copy_(old)
        if self.sum is not None:
            self.sum[:k] += self.g[:k]
        return prox

    def _proximal(self, k: int) -> Tensor | None:
        """Adds the proximal term's gradient to the first k devices' copied gradients;
        returns its value [k]."""
        total = None
        for a, b, start in self.prox_spans:
            d = self.p[:k, a:b] - start[:k]
            self.g[:k, a:b].add_(d, alpha=2 * self.prox)
            part = torch.linalg.vecdot(d, d)
            total = part if total is None else total + part
        return None if total is None else self.prox * total


def _merged(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Column spans, the adjacent ones joined."""
    out: list[tuple[int, int]] = []
    for a, b in sorted(spans):
        if out and out[-1][1] == a:
            out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out
