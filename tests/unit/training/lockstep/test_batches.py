"""A lock-step program's minibatches (raymm.training.lockstep.batches): each device's order is
the sequential path's draw from its own stream, padded with the device's first row (weight 0),
and its positions become the device's dataset rows."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch

from raymm.training.lockstep.batches import Minibatches

SEEDS = [11, 12, 13]
SIZES = np.array([5, 8, 3])          # batch 4: 2 steps an epoch, the longest device fills them
INDICES = [np.arange(10, 15), np.arange(20, 28), np.array([3, 1, 2])]


def _minibatches(epochs: int = 2) -> Minibatches:
    base = SimpleNamespace(dataset=SimpleNamespace(sensors=("a",)), model=None, train_x={},
                           training=SimpleNamespace(local_epochs=epochs, batch_size=4),
                           accelerator="cpu")
    return Minibatches(base)   # type: ignore[arg-type]


def test_every_epochs_order_is_the_devices_own_stream_padded_with_zeros() -> None:
    perms = _minibatches().all_epoch_perms(SEEDS, SIZES, 2)
    assert len(perms) == 2 and perms[0].shape == (3, 8)
    for d, (seed, n) in enumerate(zip(SEEDS, SIZES.tolist())):
        gen = torch.Generator().manual_seed(seed)
        for epoch in range(2):   # the sequential path: one randperm per epoch, in turn
            assert torch.equal(perms[epoch][d, :n], torch.randperm(n, generator=gen))
            assert not perms[epoch][d, n:].any()


def test_positions_become_the_devices_rows_and_padding_weighs_nothing() -> None:
    mb = _minibatches()
    gens = [torch.Generator().manual_seed(s) for s in SEEDS]
    rows = mb.epoch_rows(INDICES, gens, SIZES, 2)
    assert torch.equal(rows, mb.rows_of(INDICES, mb.all_epoch_perms(SEEDS, SIZES, 2)[0], 2))
    assert rows.shape == (3, 2, 4)
    flat = rows.reshape(3, -1)
    for d, n in enumerate(SIZES.tolist()):
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(SEEDS[d]))
        assert flat[d, :n].tolist() == INDICES[d][perm.numpy()].tolist()
        assert (flat[d, n:] == int(INDICES[d][0])).all()           # the device's first row
    weights = mb.weights(SIZES, 2)
    assert weights.shape == (3, 2, 4) and weights.sum(dim=(1, 2)).tolist() == [5, 8, 3]
    assert weights.reshape(3, -1)[0].tolist() == [1] * 5 + [0] * 3
