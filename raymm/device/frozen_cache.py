"""A frozen encoder's embeddings of a device's samples, kept from one round to the next.

In an MCFT stage the earlier modality's encoder is frozen on every device, often for many rounds
on end (FedMChain's vision phase keeps the audio encoder fixed for half the run). A lock-step
program computes each frozen encoder's embeddings once a round (`LockstepTrainer.
_frozen_embeddings`); a device seen in an earlier round with the very same weights, samples and
batch size would get the same numbers again, so they are kept here and checked, not trusted: an
entry is used only when every weight of the encoder equals the stored copy bit for bit.

A device's embeddings do not depend on which devices share its call (the lock-step guarantee
that makes results independent of packing), so the devices the cache lacks are computed in
calls of their own. The cache holds at most `MAX_BYTES` (least recently used entries go first).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

#: the most bytes of embeddings and weight copies one host keeps
MAX_BYTES = 64 * 2**20


@dataclass(frozen=True)
class _Entry:
    weights: dict[str, Tensor]
    indices: np.ndarray
    batch_size: int
    embeddings: Tensor          # [own steps x batch size, E], by local position

    @property
    def nbytes(self) -> int:
        tensors = [*self.weights.values(), self.embeddings]
        return sum(t.numel() * t.element_size() for t in tensors) + self.indices.nbytes


class FrozenEmbeddingCache:
    """(device, sensor) -> the embeddings of the device's sample positions under a frozen
    encoder, valid while the encoder's weights, the device's samples and the batch size are
    the ones they were computed with."""

    def __init__(self, max_bytes: int = MAX_BYTES) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple[int, str], _Entry] = OrderedDict()
        self._bytes = 0
        #: lookups that found valid embeddings, and those that did not (for tests and profiles)
        self.hits = 0
        self.misses = 0

    def get(self, device: int, sensor: str, weights: dict[str, Tensor], indices: np.ndarray,
            batch_size: int) -> Tensor | None:
        """The stored embeddings, or None when there are none for exactly these inputs."""
        entry = self._entries.get((device, sensor))
        valid = (entry is not None and entry.batch_size == batch_size
                 and entry.weights.keys() == weights.keys()
                 and np.array_equal(entry.indices, indices)
                 and all(torch.equal(entry.weights[n], w) for n, w in weights.items()))
        if not valid:
            self.misses += 1
            return None
        assert entry is not None
        self.hits += 1
        self._entries.move_to_end((device, sensor))
        return entry.embeddings

    def put(self, device: int, sensor: str, weights: dict[str, Tensor], indices: np.ndarray,
            batch_size: int, embeddings: Tensor) -> None:
        """Store copies (the caller's tensors may be views of buffers it reuses)."""
        entry = _Entry({n: w.clone() for n, w in weights.items()}, indices.copy(), batch_size,
                       embeddings.clone())
        old = self._entries.pop((device, sensor), None)
        if old is not None:
            self._bytes -= old.nbytes
        if entry.nbytes > self.max_bytes:
            return
        self._entries[(device, sensor)] = entry
        self._bytes += entry.nbytes
        while self._bytes > self.max_bytes:
            _, first = self._entries.popitem(last=False)
            self._bytes -= first.nbytes
