"""Local training of one device, sequentially (the reference path).

One `LocalTrainer` lives in each host and is reused for every device it trains: the module is
built once, and each device loads the broadcast vectors into it, so no module is rebuilt per
device per round.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from raymm import seeding
from raymm.config import ModelSpec, TrainingSpec
from raymm.data.base import Dataset
from raymm.messages import Broadcast
from raymm.models import LOCAL, GroupLayout, MultimodalNet
from raymm.policy import DeviceFinish, LossInputs, Objective


def build_model(dataset: Dataset, spec: ModelSpec, seed: int) -> MultimodalNet:
    """The same initial weights in every process: built under a fixed torch seed."""
    return build_net(dataset.sensors, {m: dataset.sensor_shape(m) for m in dataset.sensors},
                     dataset.num_classes, spec, seed)


def build_net(sensors: tuple[str, ...], shapes: dict[str, tuple[int, ...]], num_classes: int,
              spec: ModelSpec, seed: int) -> MultimodalNet:
    """`build_model` from the dataset's shapes alone (`raymm.load_model` has no dataset)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seeding.torch_seed(seed, seeding.SETUP, seeding.SERVER, "model"))
        return MultimodalNet(tuple(sensors), shapes, num_classes, spec)


def flops_per_sample(model: MultimodalNet, dataset: Dataset) -> float:
    """Forward + backward FLOPs of one training sample, counted by torch (deterministic)."""
    xs = {m: torch.zeros((2,) + dataset.sensor_shape(m)) for m in dataset.sensors}
    present = torch.ones(2, len(dataset.sensors))
    with FlopCounterMode(display=False) as counter:
        out = model(xs, present, use_adapter=model.adapter is not None)
        F.cross_entropy(out.logits, torch.zeros(2, dtype=torch.long)).backward()
    model.zero_grad(set_to_none=True)
    return max(float(counter.get_total_flops()) / 2.0, 1.0)


@dataclass(frozen=True)
class DeviceOutcome:
    updates: dict[str, np.ndarray]
    local: np.ndarray | None
    loss: float
    extras: dict[str, np.ndarray]
    state: dict[str, np.ndarray] = field(default_factory=dict)  # from `device_finish`


class LocalTrainer:
    """Trains one device at a time on a shared module."""

    def __init__(self, dataset: Dataset, model_spec: ModelSpec, training: TrainingSpec,
                 objective: Objective, seed: int, device: str = "cpu") -> None:
        self.dataset = dataset
        self.training = training
        self.objective = objective
        self.seed = seed
        self.device = torch.device(device)  # a GPU when the DeviceActor was given one
        self.model = build_model(dataset, model_spec, seed)
        self.layout = GroupLayout(self.model)
        self.flops = flops_per_sample(self.model, dataset)
        self.model.to(self.device)
        self.initial_local = (self.layout.flatten(self.model, [LOCAL])[LOCAL]
                              if LOCAL in self.layout.slots else None)
        # the model every device starts from (identical in every process: seeded build)
        self.initial = self.layout.flatten(self.model, self.layout.groups)
        # zero-copy views of the shared arrays
        self.train_x = {m: torch.from_numpy(np.asarray(dataset.train.x[m])).to(self.device)
                        for m in dataset.sensors}
        self.train_y = torch.from_numpy(np.asarray(dataset.train.y)).to(self.device)
        self._seeds: dict[tuple[int, str], dict[int, int]] = {}  # see prepare_round
        self._generators: dict[str, torch.Generator] = {}

    def inputs(self, idx: torch.Tensor, held: np.ndarray) -> dict[str, torch.Tensor]:
        """Real inputs of held sensors; all-zero tensors for the sensors a device lacks."""
        n = idx.shape[0]
        return {m: self.train_x[m][idx] if h else
                torch.zeros((n,) + self.dataset.sensor_shape(m), device=self.device)
                for m, h in zip(self.dataset.sensors, held)}

    def train(self, device: int, rnd: int, indices: np.ndarray, held: np.ndarray,
              groups: list[str], broadcast: Broadcast, local: np.ndarray | None,
              start: dict[str, np.ndarray] | None = None,
              state: dict[str, np.ndarray] | None = None, upload: bool = True
              ) -> DeviceOutcome:
        """`start` (default: the broadcast's global vectors) is what the model is loaded with;
        `state` is what the device kept from earlier rounds, passed to the objective's hooks;
        `upload` says whether this round's extras reach the server (`DeviceFinish.upload`)."""
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
        opt = self._optimizer(list(trainable.values()))
        extras = {k: torch.from_numpy(v).to(self.device) for k, v in broadcast.extras.items()}
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
        held_t = torch.from_numpy(held.astype(np.float32)).to(self.device)
        held_names = tuple(m for m, h in zip(self.dataset.sensors, held) if h)
        n, bs = idx.shape[0], self.training.batch_size
        losses = []
        for _ in range(self.training.local_epochs):
            perm = torch.randperm(n, generator=gen)
            for lo in range(0, n, bs):
                b = perm[lo:lo + bs]
                xb = {m: x[b] for m, x in xs.items()}
                present = held_t.expand(b.shape[0], -1)
                xb, present = objective.augment(xb, present, held_names, self.dataset.sensors,
                                                gen)
                if data_aug is not None:
                    xb = data_aug(xb, held_names, aug_gen)
                out = model(xb, present, use_adapter=use_adapter, split_adapter=split)
                loss = objective.loss(LossInputs(out, y[b], present, held_names, trainable,
                                                      anchor, extras, rnd, dev_tensors,
                                                      tuple(groups)))
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
                device, rnd, tuple(groups), before, updates, state,
                dict(broadcast.extras), len(losses), self.training.lr,
                self._mean_grads(grad_sum, groups, len(losses)), upload))
            dev_extras = {**dev_extras, **sent}
        return DeviceOutcome(
            updates=updates,
            local=layout.flatten(model, [LOCAL])[LOCAL] if use_adapter else local,
            loss=sum(float(v) for v in losses) / len(losses) if losses else float("nan"),
            extras=dev_extras,
            state=new_state)

    def prepare_round(self, rnd: int, devices: np.ndarray) -> None:
        """Derive the round's stream seeds of the devices about to train, all at once."""
        augments = self.dataset.augment is not None
        purposes = ["batches"] + (["data_augment"] if augments else [])
        self._seeds = {(rnd, p): dict(zip(devices.tolist(),
                                          seeding.torch_seeds(self.seed, rnd, devices, p)))
                       for p in purposes}

    def _generator(self, rnd: int, device: int, purpose: str) -> torch.Generator:
        """The device's (seed, round, device, purpose) generator: one reusable generator per
        purpose, re-seeded (devices train one after another)."""
        seed = self._seeds.get((rnd, purpose), {}).get(device)
        if seed is None:
            seed = seeding.torch_seed(self.seed, rnd, device, purpose)
        gen = self._generators.get(purpose)
        if gen is None:
            gen = self._generators[purpose] = torch.Generator()
        return gen.manual_seed(seed)

    def _mean_grads(self, grad_sum: dict[str, torch.Tensor] | None, groups: list[str],
                    steps: int) -> dict[str, np.ndarray]:
        """Per-group flat mean of the summed gradients (zeros where a parameter got none)."""
        if grad_sum is None or steps == 0:
            return {}
        out = {}
        for g in groups:
            parts = [grad_sum[s.name].reshape(-1) / steps if s.name in grad_sum
                     else torch.zeros(s.stop - s.start) for s in self.layout.slots[g]]
            out[g] = torch.cat(parts).numpy().astype(np.float32)
        return out

    def adapter_start(self, kept: np.ndarray | None) -> np.ndarray:
        """A device's residual adapter: the one it kept, else the model's initial one."""
        if kept is not None:
            return kept
        if self.initial_local is None:
            raise ValueError("this model has no device-local adapter (model.adapter: false)")
        return self.initial_local

    def _optimizer(self, params: Sequence[torch.Tensor]) -> LocalOptimizer:
        t = self.training
        if t.optimizer == "adam":
            return InPlaceAdam(params, t.lr, t.weight_decay)
        return InPlaceSGD(params, t.lr, t.momentum, t.weight_decay)


class LocalOptimizer(Protocol):
    """A device's optimizer for one round: `step` applies one minibatch's gradients."""

    params: list[torch.Tensor]

    def step(self, grads: Sequence[torch.Tensor | None]) -> None: ...


class InPlaceSGD:
    """`torch.optim.SGD` (no dampening, no Nesterov) as the very same in-place tensor operations,
    without the optimizer object: for the small models of simulated devices, building a torch
    optimizer per device and round and running its step hooks cost more than the arithmetic."""

    def __init__(self, params: Sequence[torch.Tensor], lr: float, momentum: float = 0.0,
                 weight_decay: float = 0.0) -> None:
        self.params = list(params)
        self.lr, self.momentum, self.weight_decay = lr, momentum, weight_decay
        self.buffers: list[torch.Tensor | None] = [None] * len(params)

    def step(self, grads: Sequence[torch.Tensor | None]) -> None:
        with torch.no_grad():
            for i, (p, g) in enumerate(zip(self.params, grads)):
                if g is None:  # a parameter the loss did not use: torch.optim skips it too
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


class InPlaceAdam:
    """`torch.optim.Adam` (defaults: betas 0.9/0.999, eps 1e-8, L2 `weight_decay` added to the
    gradient, no amsgrad) as the very operations of its multi-tensor implementation, without the
    optimizer object: bit-identical to `torch.optim.Adam` (tested), and on the small models of
    simulated devices about half the cost of its per-parameter loop, which dominated a step's
    optimizer time. As in torch, a parameter without a gradient is skipped and keeps its own
    step count (its bias correction counts only the steps it took)."""

    def __init__(self, params: Sequence[torch.Tensor], lr: float, weight_decay: float = 0.0,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8) -> None:
        self.params = list(params)
        self.lr, self.weight_decay, self.betas, self.eps = lr, weight_decay, betas, eps
        self.m = [torch.zeros_like(p, memory_format=torch.preserve_format) for p in params]
        self.v = [torch.zeros_like(p, memory_format=torch.preserve_format) for p in params]
        self.steps = [0] * len(params)

    def step(self, grads: Sequence[torch.Tensor | None]) -> None:
        # parameters that took the same number of steps share one bias correction: normally
        # that is all of them (one multi-tensor update); a parameter that sometimes gets no
        # gradient forms its own group
        groups: dict[int, list[int]] = {}
        for i, g in enumerate(grads):
            if g is not None:
                self.steps[i] += 1
                groups.setdefault(self.steps[i], []).append(i)
        with torch.no_grad():
            for step, idx in groups.items():
                self._update(step, [self.params[i] for i in idx],
                             [grads[i] for i in idx],  # type: ignore[misc]
                             [self.m[i] for i in idx], [self.v[i] for i in idx])

    def _update(self, step: int, params: list[torch.Tensor], grads: list[torch.Tensor],
                m: list[torch.Tensor], v: list[torch.Tensor]) -> None:
        """torch.optim.adam._multi_tensor_adam's arithmetic (capturable=False)."""
        b1, b2 = self.betas
        if self.weight_decay:
            grads = list(torch._foreach_add(grads, params, alpha=self.weight_decay))
        torch._foreach_lerp_(m, grads, 1 - b1)
        torch._foreach_mul_(v, b2)
        torch._foreach_addcmul_(v, grads, grads, 1 - b2)
        step_size = self.lr / (1 - b1 ** step)
        denom = torch._foreach_sqrt(v)
        torch._foreach_div_(denom, math.sqrt(1 - b2 ** step))
        torch._foreach_add_(denom, self.eps)
        torch._foreach_addcdiv_(params, m, denom, -step_size)
