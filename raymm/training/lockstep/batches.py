"""A lock-step program's minibatches, drawn as the sequential path draws them.

Each device's minibatch order comes from its own `(seed, round, device, "batches")` stream,
its local positions are padded to the batch size (padding: the device's first row, weighted
0), and the rows are gathered into [G, B, ...] stacks per sensor, all-zero for a sensor a
device lacks; augmentation runs device by device with each device's own generators, on its
real rows only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from raymm.phases import phase
from raymm.training._kernels.lockstep_conv import interleaved_rows, takes_interleaved
from raymm.training.sequential import SequentialTrainer


class Minibatches:
    """The data side of a lock-step trainer: minibatch orders, rows, padding weights, inputs
    and augmentation for the devices of a program, on the trainer's accelerator."""

    def __init__(self, base: SequentialTrainer) -> None:
        self.base = base
        self.sensors = base.dataset.sensors
        encoders = getattr(base.model, "encoders", None)
        #: sensors whose minibatches are gathered device-interleaved (from contiguous inputs:
        #: their samples' time steps are then rows of one matrix)
        self.interleaved = {m for m in self.sensors if isinstance(encoders, torch.nn.ModuleDict)
                            and m in encoders and base.train_x[m].is_contiguous()
                            and takes_interleaved(encoders[m], base.dataset.sensor_shape(m))}

    def epoch_rows(self, indices: Sequence[np.ndarray], gens: list[torch.Generator],
                   sizes: np.ndarray, steps: int) -> Tensor:
        """One epoch's minibatch rows of every device, drawn from its own
        `(seed, round, device, "batches")` generator exactly as the sequential path draws them
        (per epoch, after the previous epoch's augmentation draws), padded to the batch size."""
        drawn = [torch.randperm(n, generator=gen) for gen, n in zip(gens, sizes.tolist())]
        return self.rows_of(indices, _padded(drawn, steps * self.base.training.batch_size),
                            steps)

    @phase("lockstep.minibatch_orders")
    def all_epoch_perms(self, seeds: list[int], sizes: np.ndarray, steps: int
                        ) -> list[Tensor]:
        """Every epoch's minibatch order, local positions [G, steps x B] (padding: 0), when
        nothing else draws from the devices' streams: each device's epochs are consecutive
        draws of its own stream (`rows_of` turns them into the rows `epoch_rows` gives)."""
        epochs = self.base.training.local_epochs
        width = steps * self.base.training.batch_size
        gen = torch.Generator()
        seed, randperm = gen.manual_seed, torch.randperm
        # device by device, its epochs in order (`manual_seed` returns the generator)
        drawn = [randperm(n, generator=seed(s) if e == 0 else gen)
                 for s, n in zip(seeds, sizes.tolist()) for e in range(epochs)]
        perms = _padded(drawn, width).view(len(sizes), epochs, width).transpose(0, 1)
        return [perms[e] for e in range(epochs)]

    def rows_of(self, indices: Sequence[np.ndarray], perms: Tensor, steps: int) -> Tensor:
        """Dataset rows of the devices' permuted local positions (padding: each device's first
        row, weighted 0), as [G, steps, B]."""
        local = _left_aligned(np.concatenate(indices),
                              np.array([i.shape[0] for i in indices]), perms.shape[1])
        rows = torch.from_numpy(local).gather(1, perms)
        return rows.view(len(indices), steps, -1).to(self.base.accelerator)

    def weights(self, sizes: np.ndarray, steps: int) -> Tensor:
        """[G, steps, B]: 1 for a device's real rows, 0 for padding."""
        bs = self.base.training.batch_size
        real = (np.arange(steps * bs)[None, :] < sizes[:, None]).astype(np.float32)
        return torch.from_numpy(real.reshape(len(sizes), steps, bs)).to(self.base.accelerator)

    def inputs(self, rows: Tensor, helds: np.ndarray, held_t: Tensor,
                sensors: list[str] | None = None) -> tuple[dict[str, Tensor], Tensor]:
        """Each device's minibatch [G, B, ...] per sensor (of `sensors`, default all),
        all-zero for a sensor it lacks (`helds` [G, M]), and the presence mask [G, B, M]."""
        base = self.base
        g, b = rows.shape
        flat = rows.reshape(-1)
        xb = {}
        for j, m in enumerate(self.sensors):
            if sensors is not None and m not in sensors:
                continue
            shape = (g, b) + base.dataset.sensor_shape(m)
            if not helds[:, j].any():
                xb[m] = torch.zeros(shape[2:], device=base.accelerator).expand(shape)
                continue
            if m in self.interleaved:   # see `lockstep_conv.takes_interleaved`
                store = base.train_x[m]
                x = interleaved_rows(store, rows.to(store.device)).to(base.accelerator)
            else:
                x = base.rows(m, flat).view(shape)
            if not helds[:, j].all():   # a mixed bucket: zeros for the devices without it
                lacks = torch.from_numpy(np.flatnonzero(~helds[:, j])).to(base.accelerator)
                # a fresh gather; by index, a device's rows at a time (cheaper on a CPU than a
                # mask broadcast over the whole minibatch)
                x.index_fill_(0, lacks, 0.0)
            xb[m] = x
        return xb, held_t[:, None, :].expand(g, b, -1)

    def augment(self, augment: Callable[..., Any] | None, data_aug: Callable[..., Any] | None,
                 xb: dict[str, Tensor], present: Tensor, weight: Tensor,
                 per_held: list[tuple[str, ...]], gens: list[torch.Generator],
                 aug_gens: list[torch.Generator]) -> tuple[dict[str, Tensor], Tensor]:
        """The objective's augmentation, then the dataset's, device by device with each
        device's own generators and held sensors, on the real rows only (as the sequential
        path calls them); padding rows stay as they are. A hook that hands back the very
        tensor it was given changed nothing: only what it replaced is written (into a copy
        of that sensor's, or the presence mask's, stack)."""
        real = weight.sum(1).to(torch.int64).tolist()
        xs, ps = dict(xb), present   # a stack is copied on its first write
        # each device's rows as views made in one call per stack; sliced where there is padding
        rows, p_rows = {m: x.unbind(0) for m, x in xb.items()}, present.unbind(0)
        b = weight.shape[1]
        for i, gen in enumerate(gens):
            n = real[i]
            given = {m: r[i] if n == b else r[i][:n] for m, r in rows.items()}
            given_p = p_rows[i] if n == b else p_rows[i][:n]
            xa, pa = given, given_p
            if augment is not None:
                xa, pa = augment(xa, pa, per_held[i], self.sensors, gen)
            if data_aug is not None:
                xa = data_aug(xa, per_held[i], aug_gens[i])
            for m in xb:
                if xa[m] is not given[m]:
                    if xs[m] is xb[m]:
                        xs[m] = xb[m].clone()
                    xs[m][i, :n] = xa[m]
            if pa is not given_p:
                if ps is present:
                    ps = present.clone()
                ps[i, :n] = pa
        return xs, ps


def _padded(drawn: list[Tensor], width: int) -> Tensor:
    """The draws as rows of one [len(drawn), width] matrix, padded with 0 (an indexed write
    per device cost more than the draw itself, and `pad_sequence` more than `_left_aligned`)."""
    if all(d.shape[0] == width for d in drawn):
        return torch.stack(drawn)
    sizes = np.array([d.shape[0] for d in drawn])
    return torch.from_numpy(_left_aligned(torch.cat(drawn).numpy(), sizes, width))


def _left_aligned(flat: np.ndarray, sizes: np.ndarray, width: int) -> np.ndarray:
    """[len(sizes), width] int64: row i holds the next `sizes[i]` values of `flat`, then
    zeros. One masked write: row-major, the real positions are the pieces one after another."""
    out = np.zeros((sizes.shape[0], width), dtype=np.int64)
    out[np.arange(width)[None, :] < sizes[:, None]] = flat
    return out
