"""Local training of one device, sequentially (the reference path).

One `LocalTrainer` lives in each host and is reused for every device it trains: the module is
built once, and each device loads the broadcast vectors into it, so no module is rebuilt per
device per round.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from raymm import seeding
from raymm.config import ModelSpec, TrainingSpec
from raymm.data.base import Dataset
from raymm.messages import Broadcast
from raymm.models import LOCAL, GroupLayout, MultimodalNet
from raymm.policy import LossInputs, Objective


def build_model(dataset: Dataset, spec: ModelSpec, seed: int) -> MultimodalNet:
    """The same initial weights in every process: built under a fixed torch seed."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seeding.torch_seed(seed, seeding.SETUP, seeding.SERVER, "model"))
        shapes = {m: dataset.sensor_shape(m) for m in dataset.sensors}
        return MultimodalNet(dataset.sensors, shapes, dataset.num_classes, spec)


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
        # zero-copy views of the shared arrays
        self.train_x = {m: torch.from_numpy(np.asarray(dataset.train.x[m])).to(self.device)
                        for m in dataset.sensors}
        self.train_y = torch.from_numpy(np.asarray(dataset.train.y)).to(self.device)

    def inputs(self, idx: torch.Tensor, held: np.ndarray) -> dict[str, torch.Tensor]:
        """Real inputs of held sensors; all-zero tensors for the sensors a device lacks."""
        n = idx.shape[0]
        return {m: self.train_x[m][idx] if h else
                torch.zeros((n,) + self.dataset.sensor_shape(m), device=self.device)
                for m, h in zip(self.dataset.sensors, held)}

    def train(self, device: int, rnd: int, indices: np.ndarray, held: np.ndarray,
              groups: list[str], broadcast: Broadcast, local: np.ndarray | None) -> DeviceOutcome:
        model, layout = self.model, self.layout
        layout.load(model, broadcast.params)
        use_adapter = bool(self.objective.uses_adapter and LOCAL in layout.slots)
        if use_adapter:
            layout.load(model, {LOCAL: local if local is not None else self.initial_local})
        names = set(layout.names(groups + ([LOCAL] if use_adapter else [])))
        params = layout.params(model)
        for name, p in params.items():
            p.requires_grad_(name in names)
        trainable = {n: params[n] for n in sorted(names)}
        anchor = {n: p.detach().clone() for n, p in trainable.items()}
        opt = self._optimizer(list(trainable.values()))
        extras = {k: torch.from_numpy(v).to(self.device) for k, v in broadcast.extras.items()}

        gen = seeding.torch_generator(self.seed, rnd, device, "batches")
        idx = torch.from_numpy(indices.astype(np.int64))
        xs, y = self.inputs(idx, held), self.train_y[idx]
        held_t = torch.from_numpy(held.astype(np.float32)).to(self.device)
        held_names = tuple(m for m, h in zip(self.dataset.sensors, held) if h)
        n, bs = idx.shape[0], self.training.batch_size
        losses = []
        for _ in range(self.training.local_epochs):
            perm = torch.randperm(n, generator=gen)
            for start in range(0, n, bs):
                b = perm[start:start + bs]
                xb = {m: x[b] for m, x in xs.items()}
                present = held_t.expand(b.shape[0], -1)
                augment = getattr(self.objective, "augment", None)
                if augment is not None:
                    xb, present = augment(xb, present, held_names, self.dataset.sensors, gen)
                out = model(xb, present, use_adapter=use_adapter)
                loss = self.objective.loss(LossInputs(out, y[b], present, held_names, trainable,
                                                      anchor, extras, rnd))
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                losses.append(float(loss.detach()))
        report = getattr(self.objective, "device_extras", None)
        dev_extras = report(model, xs, y, held_t, use_adapter) if report is not None else {}
        return DeviceOutcome(
            updates=layout.flatten(model, groups),
            local=layout.flatten(model, [LOCAL])[LOCAL] if use_adapter else local,
            loss=float(np.mean(losses)) if losses else float("nan"), extras=dev_extras)

    def _optimizer(self, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
        t = self.training
        if t.optimizer == "adam":
            return torch.optim.Adam(params, lr=t.lr, weight_decay=t.weight_decay)
        return torch.optim.SGD(params, lr=t.lr, momentum=t.momentum, weight_decay=t.weight_decay)
