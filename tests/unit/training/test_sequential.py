"""The sequential path is the project's reference: every published run trained on it, so its
numbers must not move. `frozen_train` below is `SequentialTrainer.train` as it was before the local
update was written once (`raymm.training.local_update`), with its in-place copies of torch.optim's
SGD
and Adam, kept here unchanged; whole runs of several methods must end bit-identical with it."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pytest
import torch

from raymm.app.api import run
from raymm.app.build import load_scenario
from raymm.models import LOCAL
from raymm.protocol.messages import Broadcast
from raymm.protocol.seams import DeviceFinish, LossInputs, Objective
from raymm.training.sequential import DeviceOutcome, SequentialTrainer

from helpers import tiny_scenario


class FrozenSGD:
    def __init__(self, params: Sequence[torch.Tensor], lr: float, momentum: float,
                 weight_decay: float) -> None:
        self.params = list(params)
        self.lr, self.momentum, self.weight_decay = lr, momentum, weight_decay
        self.buffers: list[torch.Tensor | None] = [None] * len(params)

    def step(self, grads: Sequence[torch.Tensor | None]) -> None:
        with torch.no_grad():
            for i, (p, g) in enumerate(zip(self.params, grads)):
                if g is None:
                    continue
                if self.weight_decay:
                    g = g.add(p, alpha=self.weight_decay)
                if self.momentum:
                    buf = self.buffers[i]
                    if buf is None:
                        buf = self.buffers[i] = torch.clone(g).detach()
                    else:
                        buf.mul_(self.momentum).add_(g)
                    g = buf
                p.add_(g, alpha=-self.lr)


class FrozenAdam:
    def __init__(self, params: Sequence[torch.Tensor], lr: float, weight_decay: float) -> None:
        self.params = list(params)
        self.lr, self.weight_decay = lr, weight_decay
        self.m = [torch.zeros_like(p, memory_format=torch.preserve_format) for p in params]
        self.v = [torch.zeros_like(p, memory_format=torch.preserve_format) for p in params]
        self.steps = [0] * len(params)

    def step(self, grads: Sequence[torch.Tensor | None]) -> None:
        groups: dict[int, list[int]] = {}
        for i, g in enumerate(grads):
            if g is not None:
                self.steps[i] += 1
                groups.setdefault(self.steps[i], []).append(i)
        b1, b2 = 0.9, 0.999
        with torch.no_grad():
            for step, idx in groups.items():
                params = [self.params[i] for i in idx]
                gs = [grads[i] for i in idx]
                m, v = [self.m[i] for i in idx], [self.v[i] for i in idx]
                if self.weight_decay:
                    gs = list(torch._foreach_add(gs, params, alpha=self.weight_decay))
                torch._foreach_lerp_(m, gs, 1 - b1)
                torch._foreach_mul_(v, b2)
                torch._foreach_addcmul_(v, gs, gs, 1 - b2)
                step_size = self.lr / (1 - b1 ** step)
                denom = torch._foreach_sqrt(v)
                torch._foreach_div_(denom, math.sqrt(1 - b2 ** step))
                torch._foreach_add_(denom, 1e-8)
                torch._foreach_addcdiv_(params, m, denom, -step_size)


def frozen_train(self: SequentialTrainer, device: int, rnd: int, indices: np.ndarray,
                 held: np.ndarray, groups: list[str], broadcast: Broadcast,
                 local: np.ndarray | None, start: dict[str, np.ndarray] | None = None,
                 state: dict[str, np.ndarray] | None = None, upload: bool = True,
                 buffers: np.ndarray | None = None) -> DeviceOutcome:
    # `buffers` (a device's own batch-norm statistics) came later; these models have none
    assert buffers is None
    model, layout = self.model, self.layout
    layout.load(model, broadcast.params if start is None else start)
    use_adapter = bool(self.objective.uses_adapter and LOCAL in layout.slots)
    objective = self.objective
    split = use_adapter and bool(objective.split_adapter)
    if use_adapter:
        layout.load(model, {LOCAL: self.adapter_start(local)})
    names = set(layout.names(groups + ([LOCAL] if use_adapter else [])))
    params = layout.params(model)
    for name, p in params.items():
        p.requires_grad_(name in names)
    trainable = {n: params[n] for n in sorted(names)}
    anchor = {n: p.detach().clone() for n, p in trainable.items()}
    t = self.training
    opt = (FrozenAdam(list(trainable.values()), t.lr, t.weight_decay) if t.optimizer == "adam"
           else FrozenSGD(list(trainable.values()), t.lr, t.momentum, t.weight_decay))
    extras = {k: torch.from_numpy(v).to(self.accelerator) for k, v in broadcast.extras.items()}
    state = state or {}
    dev_tensors = objective.device_tensors(state, broadcast.extras, layout, groups)
    finishes = objective.overrides(Objective.device_finish)
    before = layout.flatten(model, groups) if finishes else {}
    grad_sum: dict[str, torch.Tensor] | None = {} if objective.needs_grad_mean else None
    data_aug = self.dataset.augment
    aug_gen = self._generator(rnd, device, "data_augment") if data_aug is not None else None
    gen = self._generator(rnd, device, "batches")
    idx = torch.from_numpy(indices.astype(np.int64))
    xs, y = self.inputs(idx, held), self.train_y[idx]
    held_t = torch.from_numpy(held.astype(np.float32)).to(self.accelerator)
    held_names = tuple(m for m, h in zip(self.dataset.sensors, held) if h)
    n, bs = idx.shape[0], self.training.batch_size
    losses = []
    for _ in range(self.training.local_epochs):
        perm = torch.randperm(n, generator=gen)
        for lo in range(0, n, bs):
            b = perm[lo:lo + bs]
            xb = {m: x[b] for m, x in xs.items()}
            present = held_t.expand(b.shape[0], -1)
            xb, present = objective.augment(xb, present, held_names, self.dataset.sensors, gen)
            if data_aug is not None:
                xb = data_aug(xb, held_names, aug_gen)
            out = model(xb, present, use_adapter=use_adapter, split_adapter=split)
            loss = objective.loss(LossInputs(out, y[b], present, held_names, trainable, anchor,
                                             extras, rnd, dev_tensors, tuple(groups)))
            grads = torch.autograd.grad(loss, opt.params, allow_unused=True)
            if grad_sum is not None:
                for name, g in zip(trainable, grads):
                    if g is not None:
                        grad_sum[name] = grad_sum.get(name, 0) + g
            opt.step(grads)
            losses.append(loss.detach())
    dev_extras = objective.device_extras(model, xs, y, held_t, use_adapter)
    updates = layout.flatten(model, groups)
    new_state: dict[str, np.ndarray] = {}
    if finishes:
        new_state, sent = objective.device_finish(DeviceFinish(
            device, rnd, tuple(groups), before, updates, state, dict(broadcast.extras),
            len(losses), self.training.lr, self._mean_grads(grad_sum, groups, len(losses)),
            upload))
        dev_extras = {**dev_extras, **sent}
    return DeviceOutcome(
        updates=updates,
        local=layout.flatten(model, [LOCAL])[LOCAL] if use_adapter else local,
        loss=sum(float(v) for v in losses) / len(losses) if losses else float("nan"),
        extras=dev_extras, state=new_state)


CASES = {
    "fedavg-sgd-momentum-decay": {"training.momentum": 0.9, "training.weight_decay": 1e-3,
                                  "training.batch_size": 7},
    "fedprox-adam-decay": {"method": "fedprox", "training.optimizer": "adam",
                           "training.lr": 0.01, "training.weight_decay": 1e-3},
    "scaffold": {"method": "scaffold"},
    "fedproto": {"method": "fedproto"},
    "tide": {"method": "tide", "training.lr": 0.01, "training.batch_size": 7,
             "aggregation": {"name": "tide", "warmup": 1}},
    "harmony": {"method": "harmony", "rounds": 4},
}


@pytest.fixture(autouse=True)
def _out_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # run(out=None) writes under ./runs


@pytest.mark.parametrize("case", sorted(CASES))
def test_sequential_runs_are_bit_identical_to_the_frozen_reference(case, monkeypatch):
    sc = tiny_scenario(**CASES[case])
    now = run(load_scenario(sc), out=None)
    monkeypatch.setattr(SequentialTrainer, "train", frozen_train)
    ref = run(load_scenario(sc), out=None)
    assert [r["train_loss"] for r in now.rows] == [r["train_loss"] for r in ref.rows]
    assert not any(math.isnan(r["train_loss"]) for r in ref.rows[:1])  # it did train
    assert now.params.keys() == ref.params.keys()
    for g in ref.params:
        assert now.params[g].tobytes() == ref.params[g].tobytes(), g
