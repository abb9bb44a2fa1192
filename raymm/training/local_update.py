"""A device's local update, written once: the loss of a minibatch, the minibatch loop and the
optimizer step, for one device or, under `torch.func.vmap`, for many in lock-step.

`raymm.training.sequential.SequentialTrainer` (the reference path) runs it for one device;
`raymm.training.lockstep.trainer.LockstepTrainer` runs it for a bucket of devices whose
parameters are stacked along a leading device axis. Both build a `LocalUpdate`, feed
`LocalUpdate.run` their minibatches (`Batch`: drawing and padding them is each path's own
business) and a gradient function: `one_device` differentiates the loss with
`torch.autograd.grad`; the lock-step program picks its own from the same `LocalUpdate.loss`
(`raymm.training.lockstep.gradients`). On both paths a parameter the loss does not use gets
no gradient and no step, as in `torch.optim`. Everything else -- the forward pass with the
given parameters, the objective's loss, the gradient sums of `needs_grad_mean`, the
optimizer -- is the same code on both paths. This module imports no fast-path kernel: what
the lock-step path steps differently is injected (`LockstepStepper`).

`FunctionalOptimizer` is `torch.optim.SGD` (momentum, L2 weight decay; no dampening, no
Nesterov) and `torch.optim.Adam` (betas 0.9/0.999, eps 1e-8, L2 weight decay, no amsgrad) as
pure functions, with torch's own operations in torch's order, so the sequential path's numbers
are torch.optim's bit for bit. Every operation is elementwise with Python-scalar coefficients,
so the same call on stacked [G, ...] tensors is what `vmap` over devices would compute: the
lock-step path calls it on the stacks directly for SGD. For Adam the lock-step trainer injects
`raymm.training._kernels.lockstep_adam.LockstepAdam` (the same algorithm in torch's fused
kernel, one call for a whole program instead of seven passes per parameter: other last bits
than the sequential path).

What an objective must provide to train in lock-step (it opts in with `vectorisable = True`):
  * `loss(inp)` is a pure function of tensors that works under `torch.func.vmap` and autograd:
    no `.item()`/`float()`, no Python branches on tensor values, no in-place updates of inputs,
    no random draws inside the loss (draw in `augment`);
  * every reduction over samples honours `inp.weight` (float [B]; None on the sequential path):
    use `raymm.protocol.losses.sample_mean`, and keep padding rows out of anything that compares
    samples within the batch (e.g. `raymm.protocol.losses.contrastive_ce`);
  * Python-level structure may depend only on what a bucket shares: `inp.held`, the keys of
    `inp.trainable`/`inp.anchor`, `inp.extras` (the server's broadcast, identical for every
    device) and `inp.round`. Inside the loss, `inp.trainable[name]`, `inp.anchor[name]`,
    `inp.y`, `inp.present` and `inp.out` are one device's unbatched views;
  * the module's forward reads its parameters as attributes (what `ModuleCall` replaces), and
    uses `.detach()` (or `torch.no_grad()`) for stop-gradients.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

import torch
from torch import Tensor, nn

from raymm.config.schema import TrainingSpec
from raymm.models.network import ModelOutput
from raymm.phases import phase
from raymm.protocol.seams import LossInputs, Objective

Params = dict[str, Tensor]
Grads = Mapping[str, Tensor | None]
#: (params, batch) -> (loss, gradient per parameter; None: the loss did not use it)
GradFn = Callable[[Params, "Batch"], tuple[Tensor, Grads]]


class ModuleCaller(Protocol):
    """The module called with parameter tensors given per call in place of its own (both
    trainers pass `raymm.training._kernels.module_call.ModuleCall`)."""

    model: nn.Module

    def __call__(self, params: Mapping[str, Tensor], *args: Any, **kwargs: Any) -> Any: ...


class LockstepStepper(Protocol):
    """An optimizer of a lock-step program that holds the stacked parameters itself, sets aside
    the devices without a minibatch and adds the objective's proximal term (the lock-step
    trainer injects `raymm.training._kernels.lockstep_adam.LockstepAdam` for Adam)."""

    def params(self, k: int | None = None) -> Params: ...

    def step(self, grads: Grads, k: int) -> Tensor | None: ...

    def grad_sums(self) -> Params | None: ...


#: (the starting stacks, the optimizer's settings, whether to sum the gradients, the
#: objective's proximal term (c, names)) -> the stepper of one program
StepperFactory = Callable[[Params, "FunctionalOptimizer", bool, tuple[float, tuple[str, ...]]],
                          LockstepStepper]


class Batch(NamedTuple):
    """One minibatch of one device ([B, ...]) or of a bucket ([G, B, ...]). A NamedTuple, so
    that `vmap` maps over its tensors."""

    x: dict[str, Tensor]     # per sensor; all-zero for sensors the device lacks
    y: Tensor
    present: Tensor          # float [B, M]: sensor present in this sample
    weight: Tensor | None    # float [B]: 1 real row, 0 padding; None: every row is real
    #: sensor -> [B, E] embeddings computed before the step (a frozen encoder's, see
    #: `LockstepTrainer._frozen_embeddings`); the model takes them instead of `x` there
    embeddings: dict[str, Tensor] | None = None


@dataclass
class OptimizerState:
    """Per parameter: the steps it took (torch counts per parameter), Adam's moments, SGD's
    momentum buffer. A step returns a new state and leaves this one as it was."""

    steps: dict[str, int] = field(default_factory=dict)
    m: Params = field(default_factory=dict)
    v: Params = field(default_factory=dict)
    buf: Params = field(default_factory=dict)


class FunctionalOptimizer:
    """The `TrainingSpec`'s local optimizer (fresh every round) as a pure step:
    `step(params, grads, state) -> (params, state)`, nothing updated in place."""

    BETAS = (0.9, 0.999)
    EPS = 1e-8

    def __init__(self, training: TrainingSpec) -> None:
        self.kind = training.optimizer
        self.lr, self.momentum, self.weight_decay = (training.lr, training.momentum,
                                                     training.weight_decay)

    @phase("optimizer.step")
    def step(self, params: Params, grads: Grads, state: OptimizerState,
             spend: bool = False) -> tuple[Params, OptimizerState]:
        """`spend`: the caller is done with `grads`, so plain SGD may write the new parameters
        into their memory (same numbers; it saves a fresh tensor per parameter and step)."""
        with torch.no_grad():
            if self.kind == "adam":
                return self._adam(params, grads, state)
            return self._sgd(params, grads, state, spend)

    def _sgd(self, params: Params, grads: Grads, state: OptimizerState, spend: bool
             ) -> tuple[Params, OptimizerState]:
        """torch.optim.SGD's single-tensor arithmetic."""
        out, buf = dict(params), dict(state.buf) if self.momentum else state.buf
        spare = _spare(grads, params) if spend and not self.momentum else set()
        for name, p in params.items():
            g = grads.get(name)
            if g is None:  # a parameter the loss did not use: torch.optim skips it too
                continue
            free = name in spare   # g's memory may take the new parameters
            if self.weight_decay:
                g, free = g.add(p, alpha=self.weight_decay), True
            if self.momentum:
                b = buf.get(name)
                g = buf[name] = g if b is None else b.mul(self.momentum).add(g)
                free = False
            out[name] = torch.add(p, g, alpha=-self.lr, out=g) if free \
                else p.add(g, alpha=-self.lr)
        return out, OptimizerState(state.steps, state.m, state.v, buf) if self.momentum \
            else state

    def _adam(self, params: Params, grads: Grads, state: OptimizerState
              ) -> tuple[Params, OptimizerState]:
        """torch.optim.Adam's arithmetic, with its multi-tensor operations (on CPU they are the
        single-tensor ones, op for op). Parameters that took the same number of steps share one
        bias correction: normally all of them; one that sometimes gets no gradient keeps its
        own count, as in torch. (Stacks of devices with their own counts: `LockstepAdam`.)"""
        steps, m, v = dict(state.steps), dict(state.m), dict(state.v)
        by_step: dict[int, dict[str, Tensor]] = {}  # step count -> gradient per parameter
        for name, g in grads.items():
            if g is not None:
                steps[name] = steps.get(name, 0) + 1
                by_step.setdefault(steps[name], {})[name] = g
        out = dict(params)
        b1, b2 = self.BETAS
        for step, got in by_step.items():
            names, gs = list(got), list(got.values())
            ps = [params[n] for n in names]
            if self.weight_decay:
                gs = list(torch._foreach_add(gs, ps, alpha=self.weight_decay))
            ms = torch._foreach_lerp([m[n] if n in m else torch.zeros_like(p)
                                      for n, p in zip(names, ps)], gs, 1 - b1)
            vs = torch._foreach_mul([v[n] if n in v else torch.zeros_like(p)
                                     for n, p in zip(names, ps)], b2)
            torch._foreach_addcmul_(vs, gs, gs, 1 - b2)
            denom = torch._foreach_sqrt(vs)
            torch._foreach_div_(denom, math.sqrt(1 - b2 ** step))
            torch._foreach_add_(denom, self.EPS)
            new = torch._foreach_addcdiv(ps, ms, denom, -self.lr / (1 - b1 ** step))
            for i, n in enumerate(names):
                out[n], m[n], v[n] = new[i], ms[i], vs[i]
        return out, OptimizerState(steps, m, v, dict(state.buf))


@dataclass
class UpdateResult:
    params: Params                  # the trained parameters
    losses: list[Tensor]            # one per minibatch (per device under vmap: [G] each)
    grad_sum: Params | None         # summed gradients (with `needs_grad_mean`)


class LocalUpdate:
    """One round's local update of one device, or of a bucket of devices that share its Python
    structure (held sensors, trained groups, steps per epoch)."""

    def __init__(self, call: ModuleCaller, objective: Objective, training: TrainingSpec, *,
                 use_adapter: bool, held: tuple[str, ...], extras: dict[str, Tensor],
                 round: int, groups: tuple[str, ...], unread: Mapping[str, int] | None = None,
                 steppers: Mapping[str, StepperFactory] | None = None) -> None:
        self.call, self.objective = call, objective
        #: sensor -> embedding width, for the sensors whose encoders are not run: the loss
        #: reads nothing made from them (`SequentialTrainer.unread`)
        self.unread = dict(unread or {})
        self.optimizer = FunctionalOptimizer(training)
        #: lock-step (`params` are stacks along a device axis): the optimizer that steps the
        #: stacks itself, by optimizer kind (`steppers`), and adds the objective's proximal
        #: term, which the loss then leaves out; None: `optimizer` steps, the loss holds it
        self.stepper = (steppers or {}).get(self.optimizer.kind)
        self.forward_kw = {"use_adapter": use_adapter,
                           "split_adapter": use_adapter and bool(objective.split_adapter)}
        self.held, self.extras, self.round, self.groups = held, extras, round, groups

    def proximal_in_loss(self, trained: Iterable[str]) -> tuple[float, tuple[str, ...]]:
        """(c, names) of the objective's proximal term where `loss` holds it, (0, ()) where the
        program adds it outside (`stepper`) or there is none: what a hand-written step
        (`raymm.protocol.fast_paths`) must add itself."""
        return (0.0, ()) if self.stepper is not None else self.objective.proximal(list(trained))

    def loss(self, train: Params, anchor: Params, fixed: Params, local: Params,
             batch: Batch, embeddings: Params | None = None) -> Tensor:
        """The objective's loss of one minibatch of one device: the module run with `train`
        (the parameters being trained) and `fixed` (others not left in the module);
        `embeddings`: sensors whose encoder ran already (`SensorEncoders`); the unread
        sensors' embeddings are zeros."""
        if self.unread:
            rows = batch.present.shape[0]   # the inputs' rows (`augment` may append some)
            embeddings = {**{m: torch.zeros((rows, width), device=batch.y.device)
                             for m, width in self.unread.items()}, **(embeddings or {})}
        kw = dict(self.forward_kw, embeddings=embeddings) if embeddings else self.forward_kw
        current = {**fixed, **train}
        out = self.call(current, batch.x, batch.present, **kw)

        def forward(params: Mapping[str, Tensor], x: dict[str, Tensor],
                    present: Tensor) -> ModelOutput:
            """The module again, with `params` in place of the current ones (no embeddings
            given: every encoder runs on `x`)."""
            return self.call({**current, **params}, x, present, **self.forward_kw)

        return self.objective.loss(LossInputs(out, batch.y, batch.present, self.held, train,
                                              anchor, self.extras, self.round, local,
                                              self.groups, batch.weight,
                                              self.stepper is not None, batch.x, forward))

    def one_device(self, anchor: Params, local: Params) -> GradFn:
        """The loss and gradients of one device's minibatch; parameters not trained are the
        module's own."""
        def grads(params: Params, batch: Batch) -> tuple[Tensor, Grads]:
            for p in params.values():
                p.requires_grad_(True)
            loss = self.loss(params, anchor, {}, local, batch)
            gs = torch.autograd.grad(loss, list(params.values()), allow_unused=True)
            return loss.detach(), dict(zip(params, gs))
        return grads

    def step(self, params: Params, state: OptimizerState, batch: Batch, grads_of: GradFn,
             keep_grads: bool = True) -> tuple[Params, OptimizerState, Tensor, Grads]:
        """One minibatch: (new parameters, new optimizer state, loss, gradients -- none unless
        `keep_grads`, whose memory the step may then reuse); nothing given is changed."""
        loss, grads = grads_of(params, batch)
        params, state = self.optimizer.step(params, grads, state,
                                            spend=not keep_grads)
        return params, state, loss, grads if keep_grads else {}

    @phase("local_update")
    def run(self, params: Params, batches: Iterable[Batch], grads_of: GradFn,
            grad_sum: bool = False) -> UpdateResult:
        """The minibatch loop: `step` per minibatch, from a fresh optimizer state (as a device
        builds its optimizer anew every round).

        In lock-step (`params` are stacks along a device axis), a minibatch may be
        for fewer devices than `params` holds: for its first k (a bucket is ordered by steps
        per epoch, most first, so the devices with a minibatch in a step are always a prefix).
        The others are set aside untouched -- parameters, optimizer state, gradient sums --
        and rejoin when a later minibatch (the next epoch's) is for them again, and at the
        end: a device's numbers are those of its own steps only. An injected stepper
        (`steppers`, lock-step Adam) steps every device's parameters at once instead, and adds
        the objective's proximal term (`Objective.proximal`) there.
        """
        if self.stepper is not None:
            return self._run_stepper(self.stepper, params, batches, grads_of, grad_sum)
        own = self.objective.local_steps(params, iter(batches), grads_of)
        if own is not None:   # an update rule of its own
            trained, losses = own
            return UpdateResult(trained, losses, None)
        state = OptimizerState()
        sums: Params | None = {} if grad_sum else None
        losses = []
        aside = _SetAside()
        for batch in batches:
            if batch.weight is not None:
                params, state, sums = aside.resize(batch.weight.shape[0], params, state, sums)
            params, state, loss, grads = self.step(params, state, batch, grads_of,
                                                   keep_grads=sums is not None)
            if sums is not None:
                for name, g in grads.items():
                    if g is not None:
                        sums[name] = sums[name] + g if name in sums else g
            losses.append(loss)
        params, state, sums = aside.resize(None, params, state, sums)
        return UpdateResult(params, losses, sums)

    def _run_stepper(self, stepper: StepperFactory, params: Params, batches: Iterable[Batch],
                     grads_of: GradFn, grad_sum: bool) -> UpdateResult:
        """`run` through an injected stepper, which sets devices aside itself."""
        opt = stepper(params, self.optimizer, grad_sum, self.objective.proximal(list(params)))
        losses = []
        for batch in batches:
            k = len(batch.y)
            loss, grads = grads_of(opt.params(k), batch)
            prox = opt.step(grads, k)
            losses.append(loss if prox is None else loss + prox)
        return UpdateResult(opt.params(), losses, opt.grad_sums())


def memory_order(t: Tensor) -> tuple[int, ...]:
    """`t`'s dimensions from outermost to innermost in memory (by stride; ties in order)."""
    strides = t.stride()
    return tuple(sorted(range(t.dim()), key=lambda d: (-strides[d], d)))


def _spare(grads: Grads, params: Params) -> set[str]:
    """The gradients whose memory is theirs alone: not a view, not overlapping, shared with
    no other gradient (autograd may hand one tensor to both inputs of an addition) and with
    no parameter."""
    held = {n: g for n, g in grads.items() if g is not None}
    owners = Counter(t.untyped_storage().data_ptr()
                     for t in (*held.values(), *params.values()))
    return {n for n, g in held.items()
            if g._base is None and g.permute(memory_order(g)).is_contiguous()
            and owners[g.untyped_storage().data_ptr()] == 1}


class _SetAside:
    """The trailing devices of a lock-step bucket that have no minibatch in the current step,
    kept aside as they were (parameters, SGD's momentum buffers, gradient sums), the most
    recently set aside last. A program with an injected stepper (lock-step Adam) sets rows
    aside in the stepper instead."""

    def __init__(self) -> None:
        #: (params, buf, sums), devices
        self.parts: list[tuple[tuple[Params, ...], int]] = []

    def resize(self, k: int | None, params: Params, state: OptimizerState,
               sums: Params | None) -> tuple[Params, OptimizerState, Params | None]:
        """Parameters, state and sums of the first k devices (None: of all of them again)."""
        if k is None and not self.parts:
            return params, state, sums
        if state.steps or state.m:
            raise ValueError("devices set aside with an Adam state: lock-step Adam is "
                             "an injected stepper (LocalUpdate's `steppers`)")
        n = next(iter(params.values())).shape[0]
        trees: tuple[Params, ...] = (params, state.buf, sums or {})
        if k is not None and k < n:   # devices k.. have no minibatch now
            self.parts.append((tuple({a: t[k:] for a, t in d.items()} for d in trees), n - k))
            trees = tuple({a: t[:k] for a, t in d.items()} for d in trees)
        elif self.parts and (k is None or k > n):
            back = [(trees, n)]
            while self.parts and (k is None or n < k):
                back.append(self.parts.pop())
                n += back[-1][1]
            trees = tuple(_join([part[0][i] for part in back]) for i in range(len(trees)))
        else:
            return params, state, sums
        params, buf, got = trees
        return params, OptimizerState(state.steps, state.m, state.v, buf), \
            None if sums is None else got


def _join(pieces: list[Params]) -> Params:
    """Rows of the same parameters, one piece after the other (one copy per parameter)."""
    if any(p.keys() != pieces[0].keys() for p in pieces):
        raise ValueError("devices set aside hold other state than those rejoining them")
    return {a: torch.cat([p[a] for p in pieces]) for a in pieces[0]}
