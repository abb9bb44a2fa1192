"""The simulated devices, stored column-wise so that 100,000 of them cost a few MB.

A device is a row: its sensor set (tier), availability clock (D, d, φ), hardware profile and a
slice of one shared index array into the training split. Nothing here holds a model.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from raymm import seeding
from raymm.config import PopulationSpec, TierSpec
from raymm.data.base import Dataset
from raymm.errors import ScenarioError
from raymm.safety import shares_problem


@dataclass(frozen=True)
class Population:
    """Column arrays over devices 0..n-1."""

    sensors: tuple[str, ...]          # the global sensor set M, in dataset order
    sensor_mask: np.ndarray           # bool [n, |M|]: device i holds sensor m
    tier: np.ndarray                  # int [n]: index into tier_sensors
    tier_sensors: tuple[tuple[str, ...], ...]
    pattern: np.ndarray               # int [n]: index into pattern_names
    pattern_names: tuple[str, ...]
    period: np.ndarray                # int [n]: D_i
    online_len: np.ndarray            # int [n]: d_i
    phase: np.ndarray                 # int [n]: φ_i in [0, D_i)
    hardware: np.ndarray              # int [n]: index into hardware_names
    hardware_names: tuple[str, ...]
    gflops: np.ndarray                # float [n]: compute speed
    up_bps: np.ndarray                # float [n]: uplink bytes/s
    down_bps: np.ndarray              # float [n]: downlink bytes/s
    data_offsets: np.ndarray          # int [n+1]: device i's samples are
    data_indices: np.ndarray          # data_indices[data_offsets[i]:data_offsets[i+1]]
    # each device's own test part (population.local_test_fraction), indices into the same
    # training split; empty (all offsets 0) when devices keep all their samples for training
    test_offsets: np.ndarray | None = None
    test_indices: np.ndarray | None = None

    @property
    def n(self) -> int:
        return int(self.tier.shape[0])

    @cached_property
    def num_samples(self) -> np.ndarray:
        """int64 [n], read-only: computed once (hosts read it every round)."""
        counts = np.diff(self.data_offsets)
        counts.setflags(write=False)
        return counts

    def indices(self, device: int) -> np.ndarray:
        return self.data_indices[self.data_offsets[device]:self.data_offsets[device + 1]]

    def test_indices_of(self, device: int) -> np.ndarray:
        if self.test_offsets is None or self.test_indices is None:
            return np.zeros(0, np.int64)
        return self.test_indices[self.test_offsets[device]:self.test_offsets[device + 1]]

    def online(self, t: int, devices: np.ndarray | None = None) -> np.ndarray:
        """a_i[t] = 1[(t + φ_i) mod D_i < d_i], vectorised over `devices` (default: all).

        A run of consecutive ids (what a host holds) is read as slices of the columns, not
        gathered: a million-device host polls without three 1M-element copies."""
        idx = _as_slice(devices, self.n)
        return (t + self.phase[idx]) % self.period[idx] < self.online_len[idx]

    def held(self, device: int) -> tuple[str, ...]:
        return tuple(m for m, h in zip(self.sensors, self.sensor_mask[device]) if h)

    def nbytes(self) -> int:
        return sum(int(getattr(self, f).nbytes) for f in (
            "sensor_mask", "tier", "pattern", "period", "online_len", "phase", "hardware",
            "gflops", "up_bps", "down_bps", "data_offsets", "data_indices"))


def _as_slice(devices: np.ndarray | None, n: int) -> slice | np.ndarray:
    """`devices` as a slice when it is lo, lo+1, ..., hi-1 (or None: all), else as given."""
    if devices is None:
        return slice(0, n)
    idx = np.asarray(devices)
    if idx.ndim == 1 and idx.size and idx.dtype.kind in "iu":
        lo, hi = int(idx[0]), int(idx[-1]) + 1
        if hi - lo == idx.size and 0 <= lo and np.all(idx[1:] > idx[:-1]):
            return slice(lo, hi)
    return idx


def split_counts(n: int, weights: list[float]) -> np.ndarray:
    """Largest-remainder split of n into parts proportional to weights (exact total n)."""
    w = np.asarray(weights, dtype=np.float64)
    if w.sum() <= 0:
        raise ValueError("weights must not all be zero")
    raw = w / w.sum() * n
    counts = np.floor(raw).astype(np.int64)
    rest = n - int(counts.sum())
    order = np.argsort(-(raw - counts), kind="stable")
    counts[order[:rest]] += 1
    return counts


def tier_problems(tiers: Sequence[TierSpec] | None, devices: int | None,
                  sensors: tuple[str, ...] | None = None, dataset: str = "") -> list[str]:
    """Every rule the tiers follow beyond each tier's own schema (`TierSpec`): at least one
    tier when `tiers` is given; every tier a count (adding up to `devices`, when known) or every
    tier a fraction (adding up to 1); in each tier, sensors the dataset has (when `sensors` is
    known), each listed once. `raymm validate` reports these; `build_population` refuses a
    population that breaks them (one that never went through validation)."""
    if tiers is None:
        return []  # one tier holding every sensor
    if not tiers:
        return ["population.tiers: give at least one tier (or leave tiers out: one tier "
                "holding every sensor)"]
    problems = []
    for i, t in enumerate(tiers):
        if sensors is not None and (bad := [m for m in t.sensors if m not in sensors]):
            problems.append(f"population.tiers.{i}.sensors: {', '.join(map(repr, bad))} not in "
                            f"dataset {dataset!r}; its sensors are: {', '.join(sensors)}")
        twice = sorted({m for m in t.sensors if t.sensors.count(m) > 1})
        if twice:
            problems.append(f"population.tiers.{i}.sensors: {', '.join(map(repr, twice))} "
                            "listed more than once")
    counts = [t.count for t in tiers if t.count is not None]
    if len(counts) == len(tiers):
        if devices is not None and sum(counts) != devices:
            problems.append(f"population.tiers: counts add up to {sum(counts)}, but "
                            f"population.devices is {devices}")
    elif counts:
        problems.append("population.tiers: give every tier a count, or every tier a fraction")
    else:
        shares = shares_problem("population.tiers", [t.fraction or 0.0 for t in tiers])
        problems += [shares] if shares is not None else []
    return problems


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


def tier_counts(tiers: Sequence[TierSpec], devices: int) -> np.ndarray:
    """Devices per tier: the counts, or the fractions of `devices` (largest remainder); the
    tiers follow `tier_problems`."""
    if all(t.count is not None for t in tiers):
        return np.array([t.count for t in tiers], dtype=np.int64)
    return split_counts(devices, [float(t.fraction or 0.0) for t in tiers])


def _assign(counts: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Labels 0..k-1 with the given counts, in a seeded random order over devices."""
    labels = np.repeat(np.arange(len(counts)), counts)
    return labels[rng.permutation(labels.shape[0])]


def dirichlet_partition(y: np.ndarray, n_devices: int, alpha: float, min_samples: int,
                        rng: np.random.Generator) -> list[np.ndarray]:
    """Split sample indices over devices with per-class Dirichlet(alpha) proportions.

    Devices left with fewer than `min_samples` are topped up with samples taken from the
    largest devices (one pass, deterministic), instead of redrawing until every device is large
    enough, which almost never succeeds with thousands of devices. Indices come back sorted.
    """
    return split_flat(*dirichlet_flat(y, n_devices, alpha, min_samples, rng))


def dirichlet_flat(y: np.ndarray, n_devices: int, alpha: float, min_samples: int,
                   rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """`dirichlet_partition` as (offsets [n+1], indices): device d's sorted samples are
    indices[offsets[d]:offsets[d+1]]. One flat array, never a million small ones."""
    if n_devices * min_samples > y.shape[0]:
        raise ScenarioError([dirichlet_size_problem(n_devices, min_samples, y.shape[0])])
    owner = np.empty(y.shape[0], dtype=np.int64)
    for c in np.unique(y):
        idx = np.flatnonzero(y == c)
        idx = idx[rng.permutation(idx.shape[0])]
        props = rng.dirichlet(np.full(n_devices, alpha))
        cuts = (np.cumsum(props) * idx.shape[0]).astype(np.int64)
        owner[idx] = np.searchsorted(cuts, np.arange(idx.shape[0]), side="right")
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


def build_population(spec: PopulationSpec, dataset: Dataset, seed: int) -> Population:
    """Deterministic from (seed, spec, dataset): tiers, clocks, hardware and data."""
    n = spec.devices
    sensors = dataset.sensors
    problems = tier_problems(spec.tiers, n, sensors, dataset.name)
    groups = None  # read only by a by_group partition
    if spec.partition.kind == "by_group" and dataset.train.group is not None:
        groups = int(np.unique(dataset.train.group).shape[0])
    problems += partition_problems(spec, len(dataset.train), groups)
    if problems:
        raise ScenarioError(problems)
    tiers = spec.tiers or [TierSpec(sensors=list(sensors), count=n)]
    tier_sensors = tuple(tuple(m for m in sensors if m in t.sensors) for t in tiers)
    tier = _assign(tier_counts(tiers, n),
                   seeding.rng(seed, seeding.SETUP, seeding.SERVER, "tiers"))
    mask = np.array([[m in tier_sensors[k] for m in sensors] for k in range(len(tiers))],
                    dtype=bool)[tier]

    # availability is assigned independently of sensors: its own stream, its own permutation
    av = spec.availability
    pattern = _assign(split_counts(n, [a.fraction for a in av]),
                      seeding.rng(seed, seeding.SETUP, seeding.SERVER, "patterns"))
    clocks = np.array([a.clock() for a in av], dtype=np.int64)
    period, online_len = clocks[pattern, 0], clocks[pattern, 1]
    phase = seeding.rng(seed, seeding.SETUP, seeding.SERVER, "phase").integers(0, period)

    hw = spec.hardware
    hardware = _assign(split_counts(n, [h.fraction for h in hw]),
                       seeding.rng(seed, seeding.SETUP, seeding.SERVER, "hardware"))
    jitter = np.array([h.jitter for h in hw])[hardware]

    def spread(what: str) -> np.ndarray:  # each device's own ±jitter around its profile
        return 1 + jitter * seeding.rng(seed, seeding.SETUP, seeding.SERVER, what).uniform(
            -1, 1, n)

    gflops = np.array([h.gflops for h in hw])[hardware] * spread("speed")
    up = np.array([h.up_mbps for h in hw])[hardware] * 1e6 / 8 * spread("uplink")
    down = np.array([h.down_mbps for h in hw])[hardware] * 1e6 / 8 * spread("downlink")

    offsets, flat = _partition(spec, dataset, seed)
    if spec.local_test_fraction is not None:
        empty = local_split_problem(np.diff(offsets).tolist(), spec.local_test_fraction)
        if empty:
            raise ScenarioError([empty])
    index_dtype = np.int32 if len(dataset.train) < 2**31 else np.int64
    tests: dict[str, np.ndarray] = {}
    if spec.local_test_fraction is not None:  # a seeded draw per device: a per-device loop
        parts, test_parts = local_split(split_flat(offsets, flat), spec.local_test_fraction,
                                        seed)
        offsets, flat = _flatten(parts)
        test_offsets, test_flat = _flatten(test_parts)
        tests = {"test_offsets": test_offsets, "test_indices": test_flat.astype(index_dtype)}
    return Population(
        sensors=sensors, sensor_mask=mask, tier=tier.astype(np.int32), tier_sensors=tier_sensors,
        pattern=pattern.astype(np.int16), pattern_names=tuple(a.pattern if a.pattern != "custom"
                                                               else f"custom_{a.clock()[1]}of"
                                                               f"{a.clock()[0]}" for a in av),
        period=period.astype(np.int32), online_len=online_len.astype(np.int32),
        phase=phase.astype(np.int32), hardware=hardware.astype(np.int16),
        hardware_names=tuple(h.name for h in hw), gflops=gflops.astype(np.float32),
        up_bps=up.astype(np.float32), down_bps=down.astype(np.float32),
        data_offsets=offsets, data_indices=flat.astype(index_dtype), **tests)


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
    return group_flat(dataset.train.group, spec.devices)
