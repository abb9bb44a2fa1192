"""Every random draw in raymm comes from a stream named by (seed, round, device, purpose).

Streams are pure functions of their name, so a run gives the same numbers whatever the packing
of devices into actors, the executor, or a checkpoint/resume in between (nothing is carried
from one round's generator to the next).
"""

from __future__ import annotations

import zlib

import numpy as np
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


def torch_generator(seed: int, rnd: int, device: int, purpose: str) -> torch.Generator:
    return torch.Generator().manual_seed(torch_seed(seed, rnd, device, purpose))
