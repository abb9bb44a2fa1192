"""Where a tensor's dimensions lie in memory."""

from __future__ import annotations

from torch import Tensor


def memory_order(t: Tensor) -> tuple[int, ...]:
    """`t`'s dimensions from outermost to innermost in memory (by stride; ties in order)."""
    strides = t.stride()
    return tuple(sorted(range(t.dim()), key=lambda d: (-strides[d], d)))
