"""A frozen encoder's embeddings of a device's samples, kept from one round to the next.

In an MCFT stage the earlier modality's encoder is frozen on every device, often for many rounds
on end (FedMChain's vision phase keeps the audio encoder fixed for half the run). A lock-step
program computes each frozen encoder's embeddings once a round (`FrozenEncoders.embeddings`,
below); a device seen in an earlier round with the very same weights, samples and
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

import bisect
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor
from torch.func import vmap

from raymm.phases import phase
from raymm.training.local_update import Params
from raymm.training.lockstep.batches import Minibatches
from raymm.training.lockstep.program import Program
from raymm.training.sequential import SequentialTrainer

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


class FrozenEncoders:
    """The embeddings of the encoders no device of a program trains (MCFT's earlier
    modalities), computed once a round in calls of the steps' own shapes and kept across rounds
    in a `FrozenEmbeddingCache`."""

    def __init__(self, base: SequentialTrainer, data: Minibatches,
                 encoder_params: dict[str, list[str]]) -> None:
        self.model = base.model
        self.all_sensors = base.dataset.sensors
        self.call, self.accelerator = base.call, base.accelerator
        self.batch_size = base.training.batch_size
        self.data = data
        self.encoder_params = encoder_params
        self.cache = FrozenEmbeddingCache()

    def sensors(self, names: list[str], helds: np.ndarray) -> list[str]:
        """Sensors held by some device of the program whose encoder no device trains (MCFT's
        earlier modalities): their embeddings do not change during the round."""
        if not self.model.takes_embeddings:
            return []
        trained = set(names)
        out = []
        for j, m in enumerate(self.all_sensors):
            enc = self.encoder_params[m]
            if enc and trained.isdisjoint(enc) and helds[:, j].any():
                out.append(m)
        return out

    @phase("lockstep.frozen_encoders")
    def embeddings(self, sensors: list[str], p: Program) -> dict[str, Tensor]:
        """sensor -> [G, steps x B, E]: every device's embedding of each of its samples (by
        local position) under its frozen encoder, computed once for the round instead of once
        per epoch. The calls have the steps' very shapes -- step s's devices, a minibatch of B
        samples in position order -- and a sample's embedding does not depend on the other
        samples of its call, so each is the one its steps would compute (the same bits: the
        reference runs of FedMChain in lock-step check it). A device whose encoder weights
        equal those of an earlier round's pass takes that pass's embeddings
        (`FrozenEmbeddingCache`); the others are computed in calls of their own."""
        if not sensors:
            return {}
        g, bs, steps = len(p.reqs), self.batch_size, len(p.training)
        order = torch.arange(steps * bs).expand(g, -1)
        rows = self.data.rows_of(p.indices, order, steps)   # [G, steps, B], positions in order
        return {m: self._sensor(m, p, rows) for m in sensors}

    def _sensor(self, m: str, p: Program, rows: Tensor) -> Tensor:
        """`embeddings` of one sensor: the kept ones, the others computed and kept."""
        g, bs = len(p.reqs), self.batch_size
        common = {n: p.shared[n] for n in self.encoder_params[m] if n in p.shared}
        own = {n: p.dev_frozen[n] for n in self.encoder_params[m] if n in p.dev_frozen}
        # devices whose embeddings an earlier round computed with these very weights
        own_rows = [{n: t[i] for n, t in own.items()} for i in range(g)]
        holds = p.helds[:, self.all_sensors.index(m)].tolist()
        kept = self.cache.lookup(m, [r.device for r in p.reqs], common, own_rows,
                                 [r.indices for r in p.reqs], holds, bs)
        todo = [i for i, e in enumerate(kept) if e is None]   # ascending, as devices are
        # (devices, positions, embeddings): the kept ones, then those computed step by step
        parts: list[tuple[int | slice | Tensor, slice, Tensor]] = [
            (i, slice(0, e.shape[0]), e) for i, e in enumerate(kept) if e is not None]
        parts += self._encode_steps(m, p, rows, common, own, todo)
        # positions no step reads stay zero (a program has at least one device)
        cache = parts[0][2].new_zeros((g, len(p.training) * bs, parts[0][2].shape[-1]))
        for at_rows, positions, e in parts:
            cache[at_rows, positions] = e
        self.cache.store(m, [p.reqs[i].device for i in todo],
                         [own_rows[i] for i in todo], [p.reqs[i].indices for i in todo],
                         [holds[i] for i in todo], bs,
                         [cache[i, :p.own_steps[i] * bs] for i in todo])
        return cache

    def _encode_steps(self, m: str, p: Program, rows: Tensor, common: Params, own: Params,
                      todo: list[int]) -> list[tuple[slice | Tensor, slice, Tensor]]:
        """(devices, positions, embeddings) of the devices `todo` under sensor m's frozen
        encoder, in calls of the steps' own shapes."""
        call, encoders = self.call, self.model.encoders
        assert isinstance(encoders, torch.nn.ModuleDict)   # `takes_embeddings` promises them
        bs = self.batch_size

        def encode(per: Params, x: Tensor) -> Tensor:
            return call.run({**common, **per}, encoders[m], x)
        pick = torch.tensor(todo, dtype=torch.long, device=self.accelerator)
        parts: list[tuple[slice | Tensor, slice, Tensor]] = []
        with torch.no_grad():
            for s, k in enumerate(p.training):
                # the devices to compute that have a minibatch at step s (the first k
                # devices have one); all of them: views of the stacks, not copies
                left = bisect.bisect_left(todo, k)
                if not left:
                    break   # fewer devices at each later step
                at: slice | Tensor = slice(None, k) if left == k else pick[:left]
                x = self.data.inputs(rows[at, s], p.helds[todo[:left]], p.held_t[at], [m])[0][m]
                e = vmap(encode)({n: t[at] for n, t in own.items()}, x)   # [left, B, E]
                parts.append((at, slice(s * bs, (s + 1) * bs), e))
        return parts
