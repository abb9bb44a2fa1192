"""Local training of one device at a time (the reference path).

One `SequentialTrainer` lives in each host and is reused for every device it trains: the
module is built once, and each device loads the broadcast vectors into it, so no module is
rebuilt per device per round.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace

import numpy as np
import torch
from torch import nn

from raymm import seeding
from raymm.config.schema import ModelSpec, TrainingSpec
from raymm.data.base import Dataset
from raymm.data.mapped import file_maps, is_memory_mapped, release_pages, tensor_view
from raymm.models import LOCAL, GroupLayout
from raymm.models.build import build_model
from raymm.models.layout import BUFFERS, PRIVATE
from raymm.models.size import flops_per_sample
from raymm.protocol.messages import Broadcast
from raymm.protocol.seams import DeviceFinish, Objective
from raymm.training._kernels.module_call import ModuleCall
from raymm.training.local_update import Batch, LocalUpdate, UpdateResult


@dataclass(frozen=True)
class DeviceOutcome:
    updates: dict[str, np.ndarray]
    local: np.ndarray | None
    loss: float
    extras: dict[str, np.ndarray]
    state: dict[str, np.ndarray] = field(default_factory=dict)  # from `device_finish`
    #: the device's own batch-norm statistics after training (`model.buffers: local`)
    buffers: np.ndarray | None = None


class SequentialTrainer:
    """Trains one device at a time on a shared module."""

    def __init__(self, dataset: Dataset, model_spec: ModelSpec, training: TrainingSpec,
                 objective: Objective, seed: int, accelerator: str = "cpu") -> None:
        self.dataset = dataset
        self.training = training
        self.objective = objective
        self.seed = seed
        #: the torch device it trains on: a GPU when the DeviceActor was given one
        self.accelerator = torch.device(accelerator)
        self.model = build_model(dataset, model_spec, seed)
        self.layout = GroupLayout(self.model, model_spec.buffers)
        self.flops = flops_per_sample(self.model, dataset)
        self.model.to(self.accelerator)
        self.initial_local = (self.layout.flatten(self.model, [LOCAL])[LOCAL]
                              if LOCAL in self.layout.slots else None)
        # the model every device starts from (identical in every process: seeded build)
        self.initial = self.layout.flatten(self.model, self.layout.groups)
        # the statistics a device starts from before it has its own (`model.buffers: local`)
        self.initial_buffers = (self.layout.flatten(self.model, [BUFFERS])[BUFFERS]
                                if BUFFERS in self.layout.slots else None)
        # the private blocks a device starts from before it has its own (`model.private`)
        self.initial_private = (self.layout.flatten(self.model, [PRIVATE])[PRIVATE]
                                if PRIVATE in self.layout.slots else None)
        # tensors over the shared arrays' memory, never copies: a memory-mapped split stays
        # in its files and only the rows of the devices trained here are read. On an
        # accelerator an in-memory split moves there once; a mapped one stays on the CPU, and
        # each device's rows travel (`rows`). Labels are small: they always move.
        self.store = torch.device("cpu") if is_memory_mapped(dataset) else self.accelerator
        self.train_x = {m: tensor_view(dataset.train.x[m]).to(self.store)
                        for m in dataset.sensors}
        self.train_y = tensor_view(dataset.train.y).to(self.accelerator)
        # the memory maps of the inputs (none in memory) and the round that last read them
        self._maps = file_maps(dataset.train)
        self._reading: int | None = None
        self._seeds: dict[tuple[int, str], dict[int, int]] = {}  # see prepare_round
        self._generators: dict[str, torch.Generator] = {}
        self.call = ModuleCall(self.model)  # runs the module with a device's parameters
        self._widths: dict[str, int] = {}   # see `unread`

    def unread(self, groups: tuple[str, ...], held: tuple[str, ...],
               extras: dict[str, torch.Tensor]) -> dict[str, int]:
        """sensor -> embedding width, for the sensors whose encoders a local update need not
        run: the objective's loss reads nothing made from them (`Objective.sensors_read`) and
        no trained group holds their encoder (a frozen branch in a chain's first phase)."""
        read = self.objective.sensors_read(groups, held, extras)
        if read is None or not self.model.takes_embeddings:
            return {}
        trained = {g.partition(":")[2] for g in groups if g.startswith("sensor:")}
        return {m: self._width(m) for m in self.model.sensors
                if m not in read and m not in trained}

    def _width(self, sensor: str) -> int:
        """The width of `sensor`'s embedding (its encoder run once on a zero sample)."""
        if sensor not in self._widths:
            encoders = self.model.encoders
            assert isinstance(encoders, nn.ModuleDict)   # `takes_embeddings` promises them
            encoder = encoders[sensor]
            mode = encoder.training
            encoder.eval()   # a normalisation layer must not count the zero sample
            try:
                with torch.no_grad():
                    x = torch.zeros((1, *self.dataset.sensor_shape(sensor)),
                                    device=self.accelerator)
                    self._widths[sensor] = int(encoder(x).shape[-1])
            finally:
                encoder.train(mode)
        return self._widths[sensor]

    def rows(self, sensor: str, idx: torch.Tensor) -> torch.Tensor:
        """The training inputs of `sensor` at rows `idx` (int64, on any device), on the
        training device."""
        x = self.train_x[sensor]
        return x.index_select(0, idx.to(x.device)).to(self.accelerator)   # no-ops on one device

    def inputs(self, idx: torch.Tensor, held: np.ndarray) -> dict[str, torch.Tensor]:
        """Real inputs of held sensors; all-zero tensors for the sensors a device lacks."""
        n = idx.shape[0]
        return {m: self.rows(m, idx) if h else
                torch.zeros((n,) + self.dataset.sensor_shape(m), device=self.accelerator)
                for m, h in zip(self.dataset.sensors, held)}

    def train(self, device: int, rnd: int, indices: np.ndarray, held: np.ndarray,
              groups: list[str], broadcast: Broadcast, local: np.ndarray | None,
              start: dict[str, np.ndarray] | None = None,
              state: dict[str, np.ndarray] | None = None, upload: bool = True,
              buffers: np.ndarray | None = None) -> DeviceOutcome:
        """`start` (default: the broadcast's global vectors) is what the model is loaded with;
        `state` is what the device kept from earlier rounds, passed to the objective's hooks;
        `upload` says whether this round's extras reach the server (`DeviceFinish.upload`)."""
        own, use_adapter = self._load(broadcast.params if start is None else start, buffers,
                                      local)
        layout, objective = self.layout, self.objective
        names = sorted(set(layout.names(groups + ([LOCAL] if use_adapter else []))))
        # views of the loaded values: the update never writes into them (it returns new
        # tensors), so they stay the round's anchor until the trained values are copied back
        params = {n: own[n].detach() for n in names}
        anchor = {n: own[n].detach() for n in names}
        extras = {k: torch.from_numpy(v).to(self.accelerator) for k, v in broadcast.extras.items()}
        state = state or {}
        dev_tensors = objective.device_tensors(state, broadcast.extras, layout, groups)
        finishes = objective.overrides(Objective.device_finish)
        before = layout.flatten(self.model, groups) if finishes else {}
        idx = torch.from_numpy(indices.astype(np.int64))
        xs, y = self.inputs(idx, held), self.train_y[idx]
        held_t = torch.from_numpy(held.astype(np.float32)).to(self.accelerator)
        held_names = tuple(m for m, h in zip(self.dataset.sensors, held) if h)
        update = LocalUpdate(self.call, objective, self.training, use_adapter=use_adapter,
                             held=held_names, extras=extras, round=rnd, groups=tuple(groups),
                             unread=self.unread(tuple(groups), held_names, extras))
        batches = self._batches(device, rnd, xs, y, held_t, held_names)
        # a module's own randomness (a user's dropout) draws from torch's global generator:
        # seeded per (seed, round, device), so it does not depend on who trained before
        seeding.seed_global(seeding.torch_seed(self.seed, rnd, device, "module"))
        done = update.run(params, batches, update.one_device(anchor, dev_tensors),
                          grad_sum=objective.needs_grad_mean)
        with torch.no_grad():  # the module ends holding the trained values
            for n, trained in done.params.items():
                own[n].copy_(trained)
        dev_extras = objective.device_extras(self.model, xs, y, held_t, use_adapter)
        finish = DeviceFinish(device, rnd, tuple(groups), before, {}, state,
                              dict(broadcast.extras), len(done.losses), self.training.lr,
                              {}, upload) if finishes else None
        return self._outcome(done, groups, dev_extras, finish, use_adapter, local)

    def _load(self, start: dict[str, np.ndarray], buffers: np.ndarray | None,
              local: np.ndarray | None) -> tuple[dict[str, nn.Parameter], bool]:
        """Load the device's start vectors, its statistics (its own, or the initial ones) and,
        where the objective uses it, its adapter; returns the module's parameters, none of
        them requiring a gradient (the trained ones run as separate tensors: `ModuleCall`),
        and whether the adapter is in use."""
        model, layout = self.model, self.layout
        layout.load(model, start)
        if self.initial_buffers is not None:
            layout.load(model, {BUFFERS: self.initial_buffers if buffers is None else buffers})
        use_adapter = bool(self.objective.uses_adapter and LOCAL in layout.slots)
        if use_adapter:
            layout.load(model, {LOCAL: self.adapter_start(local)})
        own = layout.params(model)
        for p in own.values():
            p.requires_grad_(False)
        return own, use_adapter

    def _outcome(self, done: UpdateResult, groups: list[str], extras: dict[str, np.ndarray],
                 finish: DeviceFinish | None, use_adapter: bool, local: np.ndarray | None
                 ) -> DeviceOutcome:
        """The trained module as the device's outcome: its groups' vectors, its adapter (or
        `local` as it came when no adapter trained), its mean step loss, and what the
        objective's `device_finish` keeps and sends (`finish`, completed here with the
        trained vectors and the mean gradient)."""
        model, layout, losses = self.model, self.layout, done.losses
        updates = layout.flatten(model, groups)
        new_state: dict[str, np.ndarray] = {}
        if finish is not None:
            new_state, sent = self.objective.device_finish(replace(
                finish, end=updates,
                grad_mean=self._mean_grads(done.grad_sum, groups, len(losses))))
            extras = {**extras, **sent}
        return DeviceOutcome(
            updates=updates,
            local=layout.flatten(model, [LOCAL])[LOCAL] if use_adapter else local,
            loss=sum(float(v) for v in losses) / len(losses) if losses else float("nan"),
            extras=extras,
            state=new_state,
            buffers=layout.flatten(model, [BUFFERS])[BUFFERS]
            if self.initial_buffers is not None else None)

    def _batches(self, device: int, rnd: int, xs: dict[str, torch.Tensor], y: torch.Tensor,
                 held_t: torch.Tensor, held_names: tuple[str, ...]) -> Iterator[Batch]:
        """The device's minibatches, every epoch a fresh order from its
        `(seed, round, device, "batches")` stream, augmented as they are drawn (so the draws
        interleave in this order, which the lock-step path reproduces)."""
        objective, data_aug = self.objective, self.dataset.augment
        aug_gen = self._generator(rnd, device, "data_augment") if data_aug is not None else None
        gen = self._generator(rnd, device, "batches")
        n, bs = y.shape[0], self.training.batch_size
        for _ in range(self.training.local_epochs):
            perm = torch.randperm(n, generator=gen)
            for lo in range(0, n, bs):
                b = perm[lo:lo + bs]
                # index_select: the same rows as x[b], and faster for large per-sample tensors
                xb = {m: x.index_select(0, b) for m, x in xs.items()}
                present = held_t.expand(b.shape[0], -1)
                xb, present = objective.augment(xb, present, held_names, self.dataset.sensors,
                                                gen)
                if data_aug is not None:
                    xb = data_aug(xb, held_names, aug_gen)
                yield Batch(xb, y.index_select(0, b), present, None)

    def start_round(self, rnd: int) -> None:
        """Before round `rnd` reads its first row: let go of the pages of mapped inputs that
        earlier rounds read (`release_pages`), so what a host keeps resident is one round's
        rows, however many rounds the run has."""
        if rnd != self._reading:
            self._reading = rnd
            release_pages(self._maps)

    def prepare_round(self, rnd: int, devices: np.ndarray) -> None:
        """Derive the round's stream seeds of the devices about to train, all at once."""
        self.start_round(rnd)
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
