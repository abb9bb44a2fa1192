"""Every random draw in raymm comes from a stream named by (seed, round, device, purpose).

Streams are pure functions of their name, so a run gives the same numbers whatever the packing
of devices into actors, the executor, or a checkpoint/resume in between (nothing is carried
from one round's generator to the next).

A stream's name goes through NumPy's `SeedSequence`. Hosts need the torch seeds of hundreds of
devices per round, and building a `SeedSequence` object per device is the slow part
(docs/performance.md, "Smaller mechanisms"), so `torch_seeds` computes the same hash for a
whole array of devices at once (checked against `SeedSequence` in the tests).
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import torch

#: Round index used for draws made once, before round 1 (population building, model init).
SETUP = -1
#: Device index used for draws that belong to the server, not to a device.
SERVER = -1


def purpose_id(purpose: str) -> int:
    """Stable integer of a purpose name (crc32; Python's hash() is salted per process)."""
    return zlib.crc32(purpose.encode())


def _key(seed: int, rnd: int, device: int, purpose: str) -> list[int]:
    # SeedSequence entropy must be non-negative: shift the two sentinels (-1) up by one.
    return [int(seed), int(rnd) + 1, int(device) + 1, purpose_id(purpose)]


def rng(seed: int, rnd: int, device: int, purpose: str) -> np.random.Generator:
    """NumPy generator of the stream (seed, round, device, purpose)."""
    return np.random.default_rng(_key(seed, rnd, device, purpose))


def torch_seed(seed: int, rnd: int, device: int, purpose: str) -> int:
    """A 63-bit torch seed derived from the same stream name."""
    ss = np.random.SeedSequence(_key(seed, rnd, device, purpose))
    return int(ss.generate_state(2, np.uint64)[0] >> np.uint64(1))


def torch_seeds(seed: int, rnd: int, devices: np.ndarray, purpose: str) -> list[int]:
    """`torch_seed` of every device in `devices`, computed for all of them at once."""
    devices = np.asarray(devices, dtype=np.int64)
    if devices.size and int(devices.max()) + 1 >= 1 << 32:  # two entropy words: the slow way
        return [torch_seed(seed, rnd, int(d), purpose) for d in devices]
    head = _words(int(seed)) + _words(int(rnd) + 1)
    columns = [np.full(devices.shape, w, np.uint32) for w in head]
    columns.append((devices + 1).astype(np.uint32))
    columns += [np.full(devices.shape, w, np.uint32) for w in _words(purpose_id(purpose))]
    state = _generate_state(_mix_entropy(columns), 2)
    first = state[0].astype(np.uint64) | (state[1].astype(np.uint64) << np.uint64(32))
    return (first >> np.uint64(1)).tolist()


def generators(seeds: Sequence[int]) -> list[torch.Generator]:
    """One torch generator per seed."""
    return [torch.Generator().manual_seed(s) for s in seeds]


def seed_global(seed: int) -> None:
    """Seed torch's global generators as `torch.manual_seed` does, without its cost where CUDA
    has not started: there `torch.manual_seed` queues the CUDA seed with a formatted stack trace
    for a later start, paid per device per round by the sequential path (docs/performance.md,
    "Smaller mechanisms"). A host
    that trains on a GPU has started CUDA before it trains, so its generators are seeded."""
    torch.default_generator.manual_seed(seed)
    if torch.cuda.is_initialized():
        torch.cuda.manual_seed_all(seed)


# --- NumPy's SeedSequence hash, vectorised over rows -------------------------------------
# The constants and the order of operations are those of numpy.random.SeedSequence (pool of
# four 32-bit words); every array below holds one word per device.
_POOL = 4
_INIT_A, _MULT_A = 0x43B0D7E5, 0x931E8875
_INIT_B, _MULT_B = 0x8B51F9DD, 0x58F38DED
_MIX_L, _MIX_R = np.uint32(0xCA01F9DD), np.uint32(0x4973F715)
_MASK = 0xFFFFFFFF
_SHIFT = np.uint32(16)


def _words(value: int) -> list[int]:
    """An entropy integer as SeedSequence splits it: 32-bit words, least significant first."""
    out = [value & _MASK]
    value >>= 32
    while value:
        out.append(value & _MASK)
        value >>= 32
    return out


class _HashConst:
    """The multiplier that SeedSequence advances at every hash; the same for every row."""

    def __init__(self, init: int, mult: int) -> None:
        self.value, self.mult = init, mult

    def mix(self, words: np.ndarray) -> np.ndarray:
        words = words ^ np.uint32(self.value)
        self.value = (self.value * self.mult) & _MASK
        words = words * np.uint32(self.value)
        return words ^ (words >> _SHIFT)


def _mix(x: npt.NDArray[np.uint32], y: npt.NDArray[np.uint32]) -> npt.NDArray[np.uint32]:
    r = _MIX_L * x - _MIX_R * y
    return r ^ (r >> _SHIFT)


def _mix_entropy(entropy: list[np.ndarray]) -> list[np.ndarray]:
    h = _HashConst(_INIT_A, _MULT_A)
    zero = np.zeros_like(entropy[0])
    pool = [h.mix(entropy[i] if i < len(entropy) else zero) for i in range(_POOL)]
    for src in range(_POOL):
        for dst in range(_POOL):
            if src != dst:
                pool[dst] = _mix(pool[dst], h.mix(pool[src]))
    for src in range(_POOL, len(entropy)):
        for dst in range(_POOL):
            pool[dst] = _mix(pool[dst], h.mix(entropy[src]))
    return pool


def _generate_state(pool: list[np.ndarray], n_words: int) -> list[np.ndarray]:
    """The first `n_words` 32-bit words of `SeedSequence.generate_state` for each row."""
    h = _HashConst(_INIT_B, _MULT_B)
    return [h.mix(pool[i % _POOL]) for i in range(n_words)]
