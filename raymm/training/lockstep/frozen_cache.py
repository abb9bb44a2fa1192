"""A frozen encoder's embeddings of a device's samples, kept from one round to the next.

In an MCFT stage the earlier modality's encoder is frozen on every device, often for many rounds
on end (FedMChain's vision phase keeps the audio encoder fixed for half the run). A lock-step
program computes each frozen encoder's embeddings once a round (`LockstepTrainer.
_frozen_embeddings`); a device seen in an earlier round with the very same weights, samples and
batch size would get the same numbers again, so they are kept here and checked, not trusted: an
entry is used only when every weight of the encoder equals the stored copy bit for bit, and the
device's sample indices, whether it holds the sensor and the batch size are those it was
computed with.

Weights every device of a program shares (the broadcast) are stored and compared once per
sensor, a device's own weights once per device. An encoder whose weights take more than an
eighth of `MAX_BYTES` is not cached: copying and comparing them would cost about what encoding
does. A device's embeddings do not depend on which devices share its call (the lock-step
guarantee that makes results independent of packing), so the devices the cache lacks are
computed in calls of their own. Least recently used entries leave first.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

#: the most bytes of embeddings and weight copies one host keeps
MAX_BYTES = 64 * 2**20

Weights = dict[str, Tensor]


def _nbytes(weights: Weights) -> int:
    return sum(t.nbytes for t in weights.values())


def _equal(a: Weights, b: Weights) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[n], t) for n, t in b.items())


@dataclass(frozen=True)
class _Entry:
    shared_version: int         # which copy of the shared weights it was computed with
    own: Weights
    indices: np.ndarray
    held: bool                  # whether the device holds the sensor (zeros as input if not)
    batch_size: int
    embeddings: Tensor          # [own steps x batch size, E], by local position

    @property
    def nbytes(self) -> int:
        return _nbytes(self.own) + self.embeddings.nbytes + self.indices.nbytes


class FrozenEmbeddingCache:
    """(device, sensor) -> the embeddings of the device's sample positions under a frozen
    encoder, valid while the encoder's weights, the device's samples and the batch size are
    the ones they were computed with."""

    def __init__(self, max_bytes: int = MAX_BYTES) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple[int, str], _Entry] = OrderedDict()
        self._shared: dict[str, tuple[int, Weights]] = {}
        self._versions = 0
        #: per sensor, the shared weights' version of its last `lookup` (None: not cached)
        self._looked_up: dict[str, int | None] = {}
        self._bytes = 0
        #: lookups that found valid embeddings, and those that did not (for tests and profiles)
        self.hits = 0
        self.misses = 0

    def _caches(self, shared: Weights, own: Weights) -> bool:
        return _nbytes(shared) + _nbytes(own) <= self.max_bytes // 8

    def lookup(self, sensor: str, devices: Sequence[int], shared: Weights,
               own: Sequence[Weights], indices: Sequence[np.ndarray], held: Sequence[bool],
               batch_size: int) -> list[Tensor | None]:
        """Per device, its stored embeddings, or None where there are none for exactly these
        weights (`shared`, the same for every device, and the device's `own`), samples,
        holding of the sensor and batch size."""
        if not devices or not self._caches(shared, own[0]):
            self._looked_up[sensor] = None
            self.misses += len(devices)
            return [None] * len(devices)
        stored = self._shared.get(sensor)
        if stored is None or not _equal(stored[1], shared):
            self._versions += 1
            old = _nbytes(stored[1]) if stored is not None else 0
            self._shared[sensor] = (self._versions, {n: t.clone() for n, t in shared.items()})
            self._bytes += _nbytes(shared) - old
        version = self._looked_up[sensor] = self._shared[sensor][0]
        out: list[Tensor | None] = []
        for device, weights, idx, holds in zip(devices, own, indices, held):
            entry = self._entries.get((device, sensor))
            valid = (entry is not None and entry.shared_version == version
                     and entry.batch_size == batch_size and entry.held == bool(holds)
                     and np.array_equal(entry.indices, idx) and _equal(entry.own, weights))
            if valid:
                assert entry is not None
                self._entries.move_to_end((device, sensor))
                out.append(entry.embeddings)
            else:
                out.append(None)
        self.hits += sum(e is not None for e in out)
        self.misses += sum(e is None for e in out)
        self._evict()
        return out

    def store(self, sensor: str, devices: Sequence[int], own: Sequence[Weights],
              indices: Sequence[np.ndarray], held: Sequence[bool], batch_size: int,
              embeddings: Sequence[Tensor]) -> None:
        """Keep copies (the caller's tensors may be views of buffers it reuses) of what the
        devices computed with the shared weights of the last `lookup` for `sensor`."""
        version = self._looked_up.get(sensor)
        if version is None:     # the last lookup did not cache
            return
        for device, weights, idx, holds, emb in zip(devices, own, indices, held, embeddings):
            entry = _Entry(version, {n: t.clone() for n, t in weights.items()}, idx.copy(),
                           bool(holds), batch_size, emb.clone())
            old = self._entries.pop((device, sensor), None)
            self._bytes += entry.nbytes - (old.nbytes if old is not None else 0)
            self._entries[(device, sensor)] = entry
        self._evict()

    def _evict(self) -> None:
        while self._bytes > self.max_bytes and self._entries:
            _, first = self._entries.popitem(last=False)
            self._bytes -= first.nbytes
