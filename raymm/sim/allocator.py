"""Process-level allocator tuning for long-lived simulator processes (the serial executor's
driver, Ray's DeviceActors and ServerActor).

A round allocates and frees the same large buffers every time: gathered minibatches, the
selected devices' stacked updates (K x P float32: 50 MB per group at K = 10,000), block sums
and merged rows. glibc serves blocks above its mmap threshold (at most 32 MiB) with fresh
mmap'd pages and unmaps them on free, so the next round pays a page fault per 4 KiB again,
which can cost an aggregation more than its own arithmetic. Keeping those pages mapped avoids
that (docs/performance.md, "Freed memory kept in the heap").
"""

from __future__ import annotations

import ctypes
import ctypes.util

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_MMAP_MAX = -4


def keep_freed_memory(mmap_threshold: int = 32 << 20, trim_threshold: int = 512 << 20,
                      large_from_heap: bool = True) -> bool:
    """Keep freed buffers in this process's heap for reuse instead of returning them to the
    kernel: blocks up to `mmap_threshold` bytes always, and with `large_from_heap` every block
    (no mmap at all: glibc cannot raise the threshold above 32 MiB). Free heap is returned
    only beyond `trim_threshold` at its top, so the process keeps about its peak, which it
    reaches again next round anyway. Idempotent; returns False where this is not glibc
    (nothing changes there). Never changes a result, only where memory comes from.
    """
    name = ctypes.util.find_library("c")
    if not name:
        return False
    try:
        libc = ctypes.CDLL(name)
        ok = bool(libc.mallopt(M_MMAP_THRESHOLD, mmap_threshold)) and \
            bool(libc.mallopt(M_TRIM_THRESHOLD, trim_threshold))
        if ok and large_from_heap:
            ok = bool(libc.mallopt(M_MMAP_MAX, 0))
        return ok
    except (OSError, AttributeError):
        return False
