"""Process-level tuning for long-lived simulator actors."""

from __future__ import annotations

import ctypes
import ctypes.util

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3


def keep_freed_memory(mmap_threshold: int = 32 << 20, trim_threshold: int = 512 << 20) -> bool:
    """Keep freed buffers of up to `mmap_threshold` bytes in this process's heap.

    Every round an actor allocates and frees the same few MB (gathered minibatches, stacked
    updates, the server's merged rows). In Ray workers glibc handed those blocks back to the
    kernel each time, so the next round paid a page fault per 4 KiB: ~1,450 minor faults per
    aggregation of 100 x 4,550 updates, 3x the aggregation's own arithmetic (measured with
    getrusage in the ServerActor). Fixed thresholds (mallopt) keep them in the heap; memory is
    then returned only above `trim_threshold` of free heap top. Returns False where this is not
    glibc (nothing changes there).
    """
    name = ctypes.util.find_library("c")
    if not name:
        return False
    try:
        libc = ctypes.CDLL(name)
        return bool(libc.mallopt(M_MMAP_THRESHOLD, mmap_threshold)) and \
            bool(libc.mallopt(M_TRIM_THRESHOLD, trim_threshold))
    except (OSError, AttributeError):
        return False
