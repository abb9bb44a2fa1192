"""The weighted mean every linear aggregator uses, in one fixed order, so hosts can pre-sum.

A per-group weighted mean (FedAvg, intra-pod merging, the mean of deltas) needs only
Σ w_i·x_i and Σ w_i over the senders. Hosts can compute those sums for their own devices and
send one float64 vector per *block* instead of one float32 row per device: at 250 selected
devices per actor that is 20x less to put in Ray's object store, and most of the server's
arithmetic moves into the actors, which run in parallel.

Floating-point sums depend on their order, and results must not depend on how devices are
packed into hosts. So the order is fixed by device ids alone:

1. ids are cut into blocks of `BLOCK` consecutive ids (block b holds ids bB .. bB+B-1);
2. a block's partial is Σ w_i·x_i over its senders in id order, in float64, computed from
   that block's rows alone; its weight is Σ w_i the same way;
3. the mean is (Σ partials, in block order) / (Σ weights, in block order), cast to float32.

A host sends a block's partial only when it hosts every id of the block; any other sender
travels as a row, and the server computes that block's partial from the rows with the very same
function. So the result is bit for bit the same for every packing, and the same whether or not
hosts pre-summed (tests/unit/protocol/test_combine.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: Ids per block. Small enough that an actor's id range holds many whole blocks (packing puts
#: contiguous ranges in actors), large enough that a block's partial (one vector) replaces
#: many rows at typical selection rates.
BLOCK = 256
#: rows `block_sums` widens to float64 at a time (a buffer that stays in the core's cache)
_ROWS = 16


@dataclass(frozen=True)
class Partials:
    """Block partials of one group: block numbers (ascending), Σ w·x per block (float64
    [nb, P]), Σ w per block, and the positions (in the result's `device_ids`) of the devices
    summed into them (for byte accounting)."""

    blocks: np.ndarray
    sums: np.ndarray
    weights: np.ndarray
    senders: np.ndarray


def block_sums(rows: np.ndarray, weights: np.ndarray, ids: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(blocks, Σ w·x per block, Σ w per block) of rows sorted by their device ids.

    A block's sums are its own rows' float64 products added row after row (what `np.add.reduce`
    over axis 0 does for vectors of more than one element), so they depend on that block's rows
    only -- never on which other blocks were summed in the same call. (`add.reduceat` would be
    one call, but it sums long segments in another order than `reduce`.)
    """
    w = np.asarray(weights, dtype=np.float64)
    block_of = np.asarray(ids, dtype=np.int64) // BLOCK
    k = block_of.shape[0]
    starts = np.flatnonzero(np.r_[True, block_of[1:] != block_of[:-1]]) if k \
        else np.zeros(0, np.int64)
    bounds = np.r_[starts, k]
    sums = np.empty((starts.shape[0], rows.shape[1]), dtype=np.float64)
    wsum = np.empty(starts.shape[0], dtype=np.float64)
    single = np.diff(bounds) == 1  # 0 + w·x is w·x: no reduction needed
    at = starts[single]
    sums[single] = np.multiply(rows[at], w[at, None], dtype=np.float64)
    wsum[single] = w[at]
    # row after row into the block's own output: the very additions of `np.add.reduce` over
    # axis 0, without widening all of a block's rows to float64 at once. `_ROWS` rows at a
    # time are widened and weighted below the running sum in a small buffer, which one reduce
    # over axis 0 adds up row after row (numpy's call per row cost more than its arithmetic)
    work = np.empty((_ROWS + 1, rows.shape[1]), dtype=np.float64)
    for j in np.flatnonzero(~single).tolist():
        lo, hi = bounds[j], bounds[j + 1]
        if rows.shape[1] == 1:  # numpy reduces a single column pairwise: keep its order
            sums[j] = np.add.reduce(np.multiply(rows[lo:hi], w[lo:hi, None],
                                                dtype=np.float64), axis=0)
        else:
            acc = sums[j]
            acc[:] = 0.0  # reduce starts from add's identity: a sum of -0.0s is +0.0
            for s in range(lo, hi, _ROWS):
                e = min(s + _ROWS, hi)
                buf, products = work[:e - s + 1], work[1:e - s + 1]
                buf[0] = acc
                np.copyto(products, rows[s:e])
                np.multiply(products, w[s:e, None], out=products)
                np.add.reduce(buf, axis=0, out=acc)
        wsum[j] = np.add.reduce(w[lo:hi])
    return block_of[starts], sums, wsum


def complete_blocks(lo: int, hi: int, n_devices: int) -> tuple[int, int]:
    """[first, last) block numbers whose ids all lie in [lo, hi) (ids run 0..n_devices-1)."""
    first = -(-lo // BLOCK)
    last = hi // BLOCK + (1 if hi == n_devices and hi % BLOCK else 0)
    return first, max(first, last)


def mean_of(partials: list[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> np.ndarray | None:
    """The weighted mean from block partials (any number of parts, each sorted by block, no
    block in two parts); None when the weights sum to zero."""
    blocks = np.concatenate([p[0] for p in partials])
    sums = np.concatenate([p[1] for p in partials])
    weights = np.concatenate([p[2] for p in partials])
    order = np.argsort(blocks, kind="stable")
    if blocks.shape[0] > 1 and np.any(np.diff(blocks[order]) == 0):
        raise ValueError("a block was summed in two places")
    total = float(np.add.reduce(weights[order]))
    if not total > 0:
        return None
    return (_sum_rows(sums, order) / total).astype(np.float32)


def sum_of(partials: list[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> np.ndarray:
    """Σ w·x (float64) from block partials, in the block order of `mean_of`: what a private
    mean divides by its fixed denominator instead of Σ w (`raymm.server.privacy`)."""
    blocks = np.concatenate([p[0] for p in partials])
    order = np.argsort(blocks, kind="stable")
    if blocks.shape[0] > 1 and np.any(np.diff(blocks[order]) == 0):
        raise ValueError("a block was summed in two places")
    return np.asarray(_sum_rows(np.concatenate([p[1] for p in partials]), order), np.float64)


def _sum_rows(rows: np.ndarray, order: np.ndarray, chunk: int = 256) -> np.ndarray:
    """`np.add.reduce(rows[order], axis=0)` -- rows added one after another in `order` --
    without gathering all of them: a chunk at a time, each continuing from the running sum (so
    the additions and their order are the very same). At a million devices a round has
    thousands of blocks; the whole gather would be one more copy of all their sums."""
    acc: np.ndarray = np.add.reduce(rows[order[:chunk]], axis=0)
    for lo in range(chunk, order.shape[0], chunk):
        block = rows[order[lo:lo + chunk]]
        acc = np.add.reduce(np.concatenate([acc[None], block]), axis=0)
    return acc


def weighted_mean(rows: np.ndarray, weights: np.ndarray, ids: np.ndarray) -> np.ndarray | None:
    """Σ w_i x_i / Σ w_i over rows sorted by device id, in the block order above."""
    return mean_of([block_sums(rows, weights, ids)])
