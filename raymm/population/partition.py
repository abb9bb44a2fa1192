"""How the training samples are split over devices: Dirichlet label skew, iid, one device
per group, devices split over the data's groups, a local test part per device; and what a
partition refuses, from sizes alone.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import numpy as np

from raymm import seeding
from raymm.config.schema import PopulationSpec
from raymm.data.base import Dataset
from raymm.errors import ScenarioError


def partition_problems(spec: PopulationSpec, n_train: int, groups: int | None) -> list[str]:
    """What partitioning `n_train` training samples (in `groups` distinct groups; None: the
    data has none) over the population refuses, from those sizes alone: `raymm validate` asks
    a loader's `DataFacts` for them, `build_population` the loaded data."""
    p, n = spec.partition, spec.devices
    if p.kind == "dirichlet" and n * p.min_samples > n_train:
        return [dirichlet_size_problem(n, p.min_samples, n_train)]
    if p.kind == "iid" and n > n_train:
        return [f"population.devices: {n} devices but only {n_train} training samples: an iid "
                f"partition would leave {n - n_train} device(s) without a sample"]
    if p.kind == "grouped":
        if groups is None:
            return ["population.partition.kind: grouped needs a dataset with groups (e.g. "
                    "dataset.groups for the synthetic data)"]
        if n < groups or n * p.min_samples > n_train:
            return [f"population.devices: a grouped partition needs at least one device per "
                    f"group ({groups} groups) and devices × min_samples ≤ the {n_train} "
                    f"training samples; got {n} devices × {p.min_samples}"]
    if p.kind == "by_group":
        if groups is None:
            return ["population.partition.kind: by_group needs a dataset with groups"]
        if groups != n:
            return [f"population.devices: by_group partition has {groups} groups but {n} "
                    "devices"]
    return []


def dirichlet_size_problem(n_devices: int, min_samples: int, n_samples: int) -> str:
    return (f"population.devices: {n_devices} devices × {min_samples} samples exceeds the "
            f"{n_samples} training samples")


def local_split_problem(sizes: Sequence[int], fraction: float) -> str | None:
    """Devices that `local_split` (same rounding) would leave without a training sample."""
    empty = [s for s in sizes if s - int(round(fraction * s)) < 1]
    if not empty:
        return None
    return (f"population.local_test_fraction: {fraction} leaves {len(empty)} device(s) without "
            f"a training sample (a device of {max(empty)} sample(s) keeps none); lower it, or "
            "give devices more samples")


def iid_sizes(n_samples: int, n_devices: int) -> list[int]:
    """Samples per device of `iid_partition` (np.array_split's sizes), without drawing."""
    q, r = divmod(n_samples, n_devices)
    return [q + 1] * r + [q] * (n_devices - r)


def dirichlet_partition(y: np.ndarray, n_devices: int, alpha: float, min_samples: int,
                        rng: np.random.Generator) -> list[np.ndarray]:
    """Split sample indices over devices with per-class Dirichlet(alpha) proportions.

    Devices left with fewer than `min_samples` are topped up with samples taken from the
    largest devices (one pass, deterministic), instead of redrawing until every device is large
    enough, which almost never succeeds with thousands of devices. Indices come back sorted.
    """
    return split_flat(*dirichlet_flat(y, n_devices, alpha, min_samples, rng))


def dirichlet_flat(y: np.ndarray, n_devices: int, alpha: float, min_samples: int,
                   rng: np.random.Generator, keep_all: bool = False
                   ) -> tuple[np.ndarray, np.ndarray]:
    """`dirichlet_partition` as (offsets [n+1], indices): device d's sorted samples are
    indices[offsets[d]:offsets[d+1]]. One flat array, never a million small ones.

    A sample whose class cut rounds past the last device belongs to nobody, and the top-up
    counts that nobody as a device below the minimum (it is given up to `min_samples` samples
    more, dropped too). `keep_all` gives such samples to the last device instead (the grouped
    partition); off, the arrays every existing scenario was run with."""
    if n_devices * min_samples > y.shape[0]:
        raise ScenarioError([dirichlet_size_problem(n_devices, min_samples, y.shape[0])])
    owner = np.empty(y.shape[0], dtype=np.int64)
    for c in np.unique(y):
        idx = np.flatnonzero(y == c)
        idx = idx[rng.permutation(idx.shape[0])]
        props = rng.dirichlet(np.full(n_devices, alpha))
        cuts = (np.cumsum(props) * idx.shape[0]).astype(np.int64)
        owner[idx] = np.searchsorted(cuts, np.arange(idx.shape[0]), side="right")
    if keep_all:
        np.minimum(owner, n_devices - 1, out=owner)
    _top_up(owner, n_devices, min_samples, rng)
    # a stable sort by owner keeps each device's samples in ascending order: already sorted.
    # A sample whose cut rounded past the last device (owner == n_devices) belongs to nobody.
    order = np.argsort(owner, kind="stable")
    offsets = np.searchsorted(owner[order], np.arange(n_devices + 1))
    return offsets, order[:offsets[-1]]


def _top_up(owner: np.ndarray, n_devices: int, min_samples: int,
            rng: np.random.Generator) -> None:
    """Move random samples from the currently largest devices to devices below the minimum.

    Device by device (ascending), until it holds `min_samples`: the donor is the largest device
    (the lowest id among equals), and the sample moved is drawn uniformly from the donor's
    samples in index order. The largest device comes from a heap over the devices that can
    ever be largest (`_donor_floor`), and a donor's samples from one sort of `owner`, so a
    million devices top up in seconds, not in a scan of every sample per move.
    """
    counts = np.bincount(owner, minlength=n_devices)
    needy = np.flatnonzero(counts < min_samples)
    if needy.size == 0:
        return
    floor = _donor_floor(counts, int((min_samples - counts[needy]).sum()), min_samples)
    heap = [(-int(c), int(d)) for d, c in zip(np.flatnonzero(counts >= floor).tolist(),
                                                counts[counts >= floor].tolist())]
    heapq.heapify(heap)
    order = np.argsort(owner, kind="stable")
    bounds = np.searchsorted(owner[order], np.arange(counts.shape[0] + 1))
    pools: dict[int, np.ndarray] = {}   # a donor's samples, ascending, as they are now
    received: set[int] = set()          # devices whose samples `order` no longer shows
    for dev in needy.tolist():
        while counts[dev] < min_samples:
            while -heap[0][0] != counts[heap[0][1]]:  # stale entries: counts changed since
                heapq.heappop(heap)
            donor = heap[0][1]
            if donor not in pools:
                pools[donor] = np.flatnonzero(owner == donor) if donor in received \
                    else order[bounds[donor]:bounds[donor + 1]].copy()
            pool = pools[donor]
            j = int(rng.integers(pool.shape[0]))
            owner[pool[j]] = dev
            pools[donor] = np.delete(pool, j)
            counts[donor] -= 1
            counts[dev] += 1
            heapq.heappush(heap, (-int(counts[donor]), donor))
            if counts[dev] >= floor:
                heapq.heappush(heap, (-int(counts[dev]), dev))
            received.add(dev)
            pools.pop(dev, None)


def _donor_floor(counts: np.ndarray, moves: int, min_samples: int) -> int:
    """A count every donor of the next `moves` moves holds at least: the largest c such that
    the devices holding ≥ c samples can give `moves` samples while the largest still holds ≥ c
    (Σ_{count ≥ c} (count - c + 1) > moves). 0 (every device) where that floor would not lie
    above `min_samples` (donors could then be devices being topped up themselves)."""
    values = np.sort(counts)[::-1].astype(np.int64)      # descending
    above = np.cumsum(values) - (values - 1) * np.arange(1, values.shape[0] + 1)
    ok = np.flatnonzero(above > moves)                    # Σ over the first i+1 at c = values[i]
    floor = int(values[ok[0]]) if ok.size else 0
    return floor if floor > min_samples else 0


def iid_partition(n_samples: int, n_devices: int, rng: np.random.Generator) -> list[np.ndarray]:
    return split_flat(*iid_flat(n_samples, n_devices, rng))


def iid_flat(n_samples: int, n_devices: int, rng: np.random.Generator
             ) -> tuple[np.ndarray, np.ndarray]:
    """A random permutation cut into `n_devices` parts as `np.array_split` cuts it (the first
    n_samples mod n_devices parts one longer), each part sorted, as (offsets, indices)."""
    perm = rng.permutation(n_samples)
    base, extra = divmod(n_samples, n_devices)
    sizes = np.full(n_devices, base, np.int64)
    sizes[:extra] += 1
    offsets = np.zeros(n_devices + 1, np.int64)
    np.cumsum(sizes, out=offsets[1:])
    # the parts are two blocks of equal-length rows: sort each block's rows in one call
    cut = extra * (base + 1)
    long = np.sort(perm[:cut].reshape(extra, base + 1), axis=1)
    short = np.sort(perm[cut:].reshape(n_devices - extra, base), axis=1)
    return offsets, np.concatenate([long.reshape(-1), short.reshape(-1)])


def split_flat(offsets: np.ndarray, indices: np.ndarray) -> list[np.ndarray]:
    """(offsets, indices) -> one array (a view) per device; for small populations and tests."""
    return [indices[offsets[d]:offsets[d + 1]] for d in range(offsets.shape[0] - 1)]


def group_partition(groups: np.ndarray | None, n_devices: int) -> list[np.ndarray]:
    """One device per group (e.g. per subject): devices must equal the number of groups."""
    return split_flat(*group_flat(groups, n_devices))


def group_flat(groups: np.ndarray | None, n_devices: int) -> tuple[np.ndarray, np.ndarray]:
    """`group_partition` as (offsets, indices)."""
    if groups is None:
        raise ScenarioError(["population.partition.kind: by_group needs a dataset with groups"])
    uniq = np.unique(groups)
    if uniq.shape[0] != n_devices:
        raise ScenarioError([f"population.devices: by_group partition has {uniq.shape[0]} groups "
                             f"but {n_devices} devices"])
    # one stable sort instead of a scan per group: the same sorted indices, in O(n log n)
    order = np.argsort(groups, kind="stable")
    bounds = np.r_[np.searchsorted(groups[order], uniq, side="left"), groups.shape[0]]
    return bounds.astype(np.int64), order


def device_groups(n_devices: int, groups: int) -> np.ndarray:
    """int [n]: the data group of each device of a grouped partition, ⌊d·G/N⌋ (contiguous
    blocks whose sizes differ by at most one)."""
    return (np.arange(n_devices, dtype=np.int64) * groups // n_devices).astype(np.int64)


def grouped_flat(y: np.ndarray, groups: np.ndarray | None, n_devices: int, alpha: float,
                 min_samples: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(offsets, indices): group g's samples split over the devices `device_groups` puts in g
    with per-class Dirichlet(alpha) proportions (`dirichlet_flat`), group after group from
    one generator; a device holds samples of its own group only."""
    if groups is None:
        raise ScenarioError(["population.partition.kind: grouped needs a dataset with groups"])
    uniq = np.unique(groups)
    owner = device_groups(n_devices, uniq.shape[0])
    parts: list[np.ndarray] = []
    for g, value in enumerate(uniq.tolist()):
        rows = np.flatnonzero(groups == value)
        devs = int((owner == g).sum())
        off, idx = dirichlet_flat(y[rows], devs, alpha, min_samples, rng, keep_all=True)
        parts += [rows[idx[off[d]:off[d + 1]]] for d in range(devs)]
    return _flatten(parts)


def local_split(parts: list[np.ndarray], test_fraction: float, seed: int
                ) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Each device's samples -> (train, test), round(fraction * n) of them in test, drawn from
    the stream (seed, SETUP, device, "local_test"); both parts sorted."""
    train, test = [], []
    for dev, idx in enumerate(parts):
        n_test = int(round(test_fraction * idx.shape[0]))
        perm = seeding.rng(seed, seeding.SETUP, dev, "local_test").permutation(idx.shape[0])
        test.append(np.sort(idx[perm[:n_test]]))
        train.append(np.sort(idx[perm[n_test:]]))
    return train, test


def _flatten(parts: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    offsets = np.zeros(len(parts) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([p.shape[0] for p in parts])
    flat = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    return offsets, flat


def _partition(spec: PopulationSpec, dataset: Dataset, seed: int
               ) -> tuple[np.ndarray, np.ndarray]:
    p = spec.partition
    r = seeding.rng(seed, seeding.SETUP, seeding.SERVER, "partition")
    if p.kind == "dirichlet":
        return dirichlet_flat(dataset.train.y, spec.devices, p.alpha, p.min_samples, r)
    if p.kind == "iid":
        return iid_flat(len(dataset.train), spec.devices, r)
    if p.kind == "grouped":
        return grouped_flat(dataset.train.y, dataset.train.group, spec.devices, p.alpha,
                            p.min_samples, r)
    return group_flat(dataset.train.group, spec.devices)
