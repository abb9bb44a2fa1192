"""The simulated devices, stored column-wise so that 100,000 of them cost a few MB.

A device is a row: its sensor set (tier), availability clock (D, d, φ), hardware profile and a
slice of one shared index array into the training split. Nothing here holds a model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from raymm import seeding
from raymm.config.limits import shares_problem
from raymm.config.schema import PopulationSpec, TierSpec
from raymm.data.base import Dataset, resolve_data_path
from raymm.errors import ScenarioError
from raymm.population.availability import Availability, PeriodicAvailability, TraceAvailability
from raymm.population.partition import (
    _flatten,
    _partition,
    device_groups,
    local_split,
    local_split_problem,
    partition_problems,
    split_flat,
)
from raymm.population.traces import Trace, load_trace, map_devices


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
    # availability on the seconds axis (raymm.population.availability; docs/time.md): a
    # trace's entries (`trace`, `trace_entry[i]` device i's) replace the periodic columns;
    # `slot_seconds` is the length of one slot (one round of the round clock)
    trace: Trace | None = None
    trace_entry: np.ndarray | None = None
    slot_seconds: float = 60.0
    # each device's own test part (population.local_test_fraction), indices into the same
    # training split; empty (all offsets 0) when devices keep all their samples for training
    test_offsets: np.ndarray | None = None
    test_indices: np.ndarray | None = None
    # int [n]: the data group of each device (`partition.kind: grouped`); None otherwise.
    # Ground truth for diagnostics (devices.parquet, per-group accuracy, clusters' ARI), never
    # shown to a policy
    data_group: np.ndarray | None = None

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
        With a trace: available at the instant (t-1)·slot_seconds (the round clock; under
        clock.mode: seconds the server reads `availability` at its own clock instead).

        A run of consecutive ids (what a host holds) is read as slices of the columns, not
        gathered: a million-device host polls without three 1M-element copies."""
        idx = _as_slice(devices, self.n)
        if self.trace is not None:
            ids = np.arange(self.n)[idx] if isinstance(idx, slice) else idx
            return self.availability.available((t - 1) * self.slot_seconds, ids)
        return (t + self.phase[idx]) % self.period[idx] < self.online_len[idx]

    @cached_property
    def availability(self) -> Availability:
        """Availability in simulated seconds (the API in raymm.population.availability)."""
        if self.trace is not None and self.trace_entry is not None:
            return TraceAvailability(self.trace, self.trace_entry)
        return PeriodicAvailability(self.period, self.online_len, self.phase, self.slot_seconds)

    def compute_seconds(self, devices: np.ndarray, epochs: int, flops_per_sample: float
                        ) -> np.ndarray:
        """float64 [n]: simulated local-training seconds of `devices` (epochs × samples ×
        FLOPs per sample / speed; the formula of raymm.protocol.traffic.compute_seconds)."""
        ids = np.asarray(devices, np.int64)
        return epochs * self.num_samples[ids].astype(np.float64) * flops_per_sample / (
            self.gflops[ids].astype(np.float64) * 1e9)

    def traffic_seconds(self, devices: np.ndarray, bytes_down: np.ndarray | int,
                        bytes_up: np.ndarray | int) -> np.ndarray:
        """float64 [n]: seconds to receive `bytes_down` and send `bytes_up` over each device's
        bandwidths (raymm.protocol.traffic.comm_seconds)."""
        ids = np.asarray(devices, np.int64)
        return np.asarray(bytes_down, np.float64) / self.down_bps[ids].astype(np.float64) \
            + np.asarray(bytes_up, np.float64) / self.up_bps[ids].astype(np.float64)

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


def build_population(spec: PopulationSpec, dataset: Dataset, seed: int) -> Population:
    """Deterministic from (seed, spec, dataset): tiers, clocks, hardware and data."""
    n = spec.devices
    sensors = dataset.sensors
    problems = tier_problems(spec.tiers, n, sensors, dataset.name)
    groups = None  # read only by a by_group or grouped partition
    if spec.partition.kind in ("by_group", "grouped") and dataset.train.group is not None:
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

    trace, entry = _trace_columns(spec, n, seed)

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

    if trace is not None and entry is not None and spec.trace is not None \
            and spec.trace.hardware:  # a trace's own speed and bandwidths, where it gives them
        gflops, up, down = _trace_hardware(trace, entry, gflops, up, down)

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
    if spec.partition.kind == "grouped":
        assert groups is not None
        tests["data_group"] = device_groups(n, groups)
    return Population(
        sensors=sensors, sensor_mask=mask, tier=tier.astype(np.int32), tier_sensors=tier_sensors,
        pattern=pattern.astype(np.int16), pattern_names=tuple(a.pattern if a.pattern != "custom"
                                                               else f"custom_{a.clock()[1]}of"
                                                               f"{a.clock()[0]}" for a in av),
        period=period.astype(np.int32), online_len=online_len.astype(np.int32),
        phase=phase.astype(np.int32), hardware=hardware.astype(np.int16),
        hardware_names=tuple(h.name for h in hw), gflops=gflops.astype(np.float32),
        up_bps=up.astype(np.float32), down_bps=down.astype(np.float32),
        data_offsets=offsets, data_indices=flat.astype(index_dtype),
        slot_seconds=float(spec.slot_seconds), trace=trace, trace_entry=entry, **tests)


def _trace_columns(spec: PopulationSpec, n: int, seed: int
                   ) -> tuple[Trace | None, np.ndarray | None]:
    """(trace, each device's entry) of a population with `population.trace` (else Nones): the
    trace loaded from its file, the entries drawn by `traces.map_devices`."""
    if spec.trace is None:
        return None, None
    ts = spec.trace
    trace = load_trace(ts.format, resolve_data_path(ts.path),
                       None if ts.capacity is None else resolve_data_path(ts.capacity))
    return trace, map_devices(n, trace, seed)


def _trace_hardware(trace: Trace, entry: np.ndarray, gflops: np.ndarray, up: np.ndarray,
                    down: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Speed (a factor on the profile's GFLOP/s) and bandwidths (Mbit/s) from the trace where
    its entries give them; the profile's values elsewhere."""
    def pick(column: np.ndarray | None, base: np.ndarray, scale: float,
             factor: bool) -> np.ndarray:
        if column is None:
            return base
        v = column[entry]
        return np.where(np.isfinite(v), base * v if factor else v * scale, base)

    return (pick(trace.speed, gflops, 1.0, True), pick(trace.up_mbps, up, 1e6 / 8, False),
            pick(trace.down_mbps, down, 1e6 / 8, False))
