"""Device traces: when real devices were available, and how fast they were.

A `Trace` holds entries (traced devices), each with an observed window [w0, w1) and sorted,
disjoint availability intervals inside it, on one common axis of seconds; optionally each
entry's speed (a factor on its hardware profile's GFLOP/s) and bandwidths (Mbit/s). Loaders:

- `load_flash`: the FLASH device-state trace (`flash_state_traces.json`: per device
  `isSuccess`, `trace_start`, `trace_end`, `ready_time` [[start, end], ...]); entries without a
  trace (`isSuccess` false) are left out.
- `load_fedscale`: FedScale's `client_behave_trace` (per client `active` and `inactive` lists
  of interval starts and ends, `finish_time` the window's end, `duration`) and, optionally,
  `client_device_capacity` (per client `computation`, ms per sample, and `communication`,
  kbit/s). FedScale ships both as pickles: they are read by `safe_unpickle`, which builds plain
  dicts, lists, numbers and strings only and refuses every other object.
- `load_raymm`: raymm's own format, a CSV or Parquet table of rows (device, start, end) in
  seconds, with optional columns window_start, window_end, speed, up_mbps, down_mbps
  (docs/time.md). `write_raymm` writes it; `raymm data prepare flash|fedscale` converts.

`map_devices` assigns a scenario's N devices to entries, seeded and independently of sensors
and data (without replacement while N fits the trace, with replacement beyond).
Pure numpy (and pandas for the table format); no Ray.
"""

from __future__ import annotations

import io
import json
import pickle
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from raymm import seeding
from raymm.data.base import resolve_data_path
from raymm.errors import DataError

#: columns of raymm's trace table; the first three are required
COLUMNS = ("device", "start", "end", "window_start", "window_end", "speed", "up_mbps",
           "down_mbps")
FORMATS = ("raymm", "flash", "fedscale")


@dataclass(frozen=True)
class Trace:
    """Entries 0..E-1: names, windows and intervals (flat, `offsets` per entry)."""

    names: tuple[str, ...]
    offsets: np.ndarray        # int64 [E+1]
    starts: np.ndarray         # float64 [I], seconds on the common axis
    ends: np.ndarray           # float64 [I]
    window_start: np.ndarray   # float64 [E]
    window_end: np.ndarray     # float64 [E]
    speed: np.ndarray | None = None     # float64 [E]: factor on the profile's GFLOP/s (NaN: 1)
    up_mbps: np.ndarray | None = None   # float64 [E] (NaN: the profile's)
    down_mbps: np.ndarray | None = None
    source: str = ""
    # derived lookup tables (see `TraceAvailability._locate`)
    span: np.ndarray = field(init=False, repr=False)
    stride: float = field(init=False, repr=False)
    keys: np.ndarray = field(init=False, repr=False)
    origin: float = field(init=False, repr=False)

    def __post_init__(self) -> None:
        span = self.window_end - self.window_start
        e_of = np.repeat(np.arange(self.entries, dtype=np.int64), np.diff(self.offsets))
        stride = float(span.max()) * 2 + 1 if span.size else 1.0
        object.__setattr__(self, "span", span)
        object.__setattr__(self, "stride", stride)
        object.__setattr__(self, "keys", e_of * stride + (self.starts - self.window_start[e_of]))
        object.__setattr__(self, "origin", float(self.window_start.min()) if span.size else 0.0)

    @property
    def entries(self) -> int:
        return int(self.window_start.shape[0])

    def intervals(self, entry: int) -> np.ndarray:
        """float64 [k, 2]: entry's intervals (start, end) on the common axis."""
        lo, hi = int(self.offsets[entry]), int(self.offsets[entry + 1])
        return np.stack([self.starts[lo:hi], self.ends[lo:hi]], axis=1)

    def online_share(self) -> np.ndarray:
        """float [E]: share of each entry's window it is available."""
        length = np.add.reduceat(np.append(self.ends - self.starts, 0.0),
                                 self.offsets[:-1]) * (np.diff(self.offsets) > 0)
        return length / self.span


def build_trace(names: Sequence[str], intervals: Sequence[Sequence[Sequence[float]]],
                windows: Sequence[tuple[float, float]] | None = None,
                speed: Sequence[float] | np.ndarray | None = None,
                up_mbps: Sequence[float] | np.ndarray | None = None,
                down_mbps: Sequence[float] | np.ndarray | None = None,
                source: str = "") -> Trace:
    """A `Trace` from per-entry interval lists: each entry's intervals are sorted, clipped to
    its window (default: its first start to its last end) and merged where they touch. One
    `DataError` lists what is wrong."""
    problems: list[str] = []
    if not names:
        problems.append(f"{source or 'trace'}: no entries")
    starts: list[np.ndarray] = []
    ends: list[np.ndarray] = []
    w0s, w1s = [], []
    for i, (name, rows) in enumerate(zip(names, intervals)):
        arr = np.asarray(rows, np.float64).reshape(-1, 2) if len(rows) else np.zeros((0, 2))
        if not np.isfinite(arr).all():
            problems.append(f"entry {name!r}: an interval that is not a finite number")
            arr = arr[np.isfinite(arr).all(axis=1)]
        if (arr[:, 1] < arr[:, 0]).any():
            problems.append(f"entry {name!r}: an interval ends before it starts")
        arr = arr[np.argsort(arr[:, 0], kind="stable")]
        if windows is not None:
            w0, w1 = float(windows[i][0]), float(windows[i][1])
        elif arr.size:
            w0, w1 = float(arr[:, 0].min()), float(arr[:, 1].max())
        else:
            w0, w1 = 0.0, 1.0
        if not (np.isfinite(w0) and np.isfinite(w1) and w1 > w0):
            problems.append(f"entry {name!r}: its window [{w0}, {w1}) is empty")
            w1 = w0 + 1.0
        arr = np.clip(arr, w0, w1)
        arr = _merge(arr[arr[:, 1] > arr[:, 0]])
        starts.append(arr[:, 0])
        ends.append(arr[:, 1])
        w0s.append(w0)
        w1s.append(w1)
    if problems:
        raise DataError("; ".join(problems[:20] + ([f"... and {len(problems) - 20} more"]
                                                   if len(problems) > 20 else [])))
    counts = np.array([s.shape[0] for s in starts], np.int64)
    if counts.sum() == 0:
        raise DataError(f"{source or 'trace'}: no entry has an availability interval")

    def column(v: Sequence[float] | np.ndarray | None) -> np.ndarray | None:
        return None if v is None else np.asarray(v, np.float64)

    return Trace(tuple(str(n) for n in names), np.concatenate([[0], np.cumsum(counts)]),
                 np.concatenate(starts), np.concatenate(ends), np.array(w0s), np.array(w1s),
                 column(speed), column(up_mbps), column(down_mbps), source)


def _merge(arr: np.ndarray) -> np.ndarray:
    """Sorted intervals with overlapping or touching ones merged."""
    if arr.shape[0] < 2:
        return arr
    reach = np.maximum.accumulate(arr[:, 1])
    new = np.concatenate([[True], arr[1:, 0] > reach[:-1]])
    group = np.cumsum(new) - 1
    return np.stack([arr[new, 0], np.maximum.reduceat(arr[:, 1], np.flatnonzero(new))], axis=1) \
        if group.size else arr


# --- FLASH --------------------------------------------------------------------------------------
def load_flash(path: str | Path) -> Trace:
    """The FLASH device-state trace (JSON): entries with `isSuccess` true, their observed
    window and `ready_time` intervals."""
    path = Path(path)
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise DataError(f"{path}: cannot read a FLASH trace: {exc}") from None
    if not isinstance(raw, dict):
        raise DataError(f"{path}: a FLASH trace is a JSON object keyed by device id")
    names, rows, windows = [], [], []
    for key, v in raw.items():
        if not isinstance(v, dict) or not v.get("isSuccess"):
            continue
        try:
            windows.append((float(v["trace_start"]), float(v["trace_end"])))
            rows.append([(float(a), float(b)) for a, b in v.get("ready_time") or []])
        except (KeyError, TypeError, ValueError) as exc:
            raise DataError(f"{path}: device {key!r}: not a FLASH entry ({exc!r})") from None
        names.append(str(key))
    return build_trace(names, rows, windows, source=f"flash:{path.name}")


# --- FedScale -----------------------------------------------------------------------------------
class _PlainUnpickler(pickle.Unpickler):
    """Builds dicts, lists, tuples, numbers, strings, bytes, None and booleans: the pickle
    opcodes for those need no class lookup, so refusing every lookup refuses all else."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(
            f"refused to load {module}.{name}: a trace pickle may hold only plain dicts, "
            "lists, numbers and strings")


def safe_unpickle(data: bytes, what: str = "pickle") -> Any:
    """Unpickle plain data only (`_PlainUnpickler`); anything else is a `DataError`."""
    try:
        return _PlainUnpickler(io.BytesIO(data)).load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError,
            IndexError, KeyError) as exc:
        raise DataError(f"{what}: not a plain-data pickle: {exc}") from None


def _read_plain(path: Path) -> Any:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise DataError(f"{path}: {exc.strerror or exc}") from None
    return safe_unpickle(data, str(path))


def load_fedscale(behave: str | Path | Mapping[Any, Any],
                  capacity: str | Path | Mapping[Any, Any] | None = None) -> Trace:
    """FedScale's `client_behave_trace` (a path to its pickle, or the dict itself), with its
    `client_device_capacity` when given. Entry windows are [0, finish_time) and repeat with
    that period, as FedScale reads them; a client's intervals are zip(active, inactive).
    `computation` (ms per sample; larger is slower) becomes a speed factor relative to the
    median client; `communication` (kbit/s) the up- and downlink bandwidth."""
    where = str(behave) if not isinstance(behave, Mapping) else "client_behave_trace"
    beh = behave if isinstance(behave, Mapping) else _read_plain(Path(behave))
    cap: Any = capacity if capacity is None or isinstance(capacity, Mapping) \
        else _read_plain(Path(capacity))
    if not isinstance(beh, Mapping) or not beh:
        raise DataError(f"{where}: a client_behave_trace is a non-empty dict of clients")
    if cap is not None and not isinstance(cap, Mapping):
        raise DataError("client_device_capacity: a dict of clients")
    names, rows, windows, comp, comm = [], [], [], [], []
    for key in sorted(beh, key=_sort_key):
        v = beh[key]
        try:
            active = [float(a) for a in v["active"]]
            inactive = [float(b) for b in v["inactive"]]
            finish = float(v["finish_time"])
        except (KeyError, TypeError, ValueError) as exc:
            raise DataError(f"{where}: client {key!r}: needs active, inactive and "
                            f"finish_time ({exc!r})") from None
        n = min(len(active), len(inactive))
        names.append(str(key))
        rows.append(list(zip(active[:n], inactive[:n])))
        windows.append((0.0, finish))
        c = cap.get(key) if cap is not None else None
        comp.append(float(c["computation"]) if isinstance(c, Mapping) and "computation" in c
                    else np.nan)
        comm.append(float(c["communication"]) if isinstance(c, Mapping)
                    and "communication" in c else np.nan)
    speed = up = None
    if cap is not None:
        ms = np.array(comp)
        good = np.isfinite(ms) & (ms > 0)
        speed = np.where(good, np.median(ms[good]) / np.where(good, ms, 1.0), np.nan) \
            if good.any() else np.full(len(ms), np.nan)
        kbps = np.array(comm)
        up = np.where(np.isfinite(kbps) & (kbps > 0), kbps / 1000.0, np.nan)
    return build_trace(names, rows, windows, speed, up, up, source=f"fedscale:{where}")


def _sort_key(key: Any) -> tuple[int, Any]:
    return (0, key) if isinstance(key, int) else (1, str(key))


# --- raymm's own table --------------------------------------------------------------------------
def load_raymm(path: str | Path) -> Trace:
    """raymm's trace table (.csv or .parquet): rows (device, start, end) in seconds; a row
    with empty start and end declares a device without intervals; optional per-device
    columns window_start, window_end (default: the whole table's first start and last end,
    one common window), speed, up_mbps, down_mbps (one value per device)."""
    # deferred: pandas (and pyarrow) load only when a trace table is read
    import pandas as pd

    path = Path(path)
    try:
        df = pd.read_parquet(path) if path.suffix.lower() in (".parquet", ".pq") \
            else pd.read_csv(path)
    except (OSError, ValueError, ImportError) as exc:
        raise DataError(f"{path}: cannot read a trace table: {exc}") from None
    missing = [c for c in COLUMNS[:3] if c not in df.columns]
    unknown = [c for c in df.columns if c not in COLUMNS]
    if missing or unknown:
        raise DataError(f"{path}: " + "; ".join(
            ([f"missing column(s) {', '.join(missing)}"] if missing else [])
            + ([f"unknown column(s) {', '.join(map(str, unknown))}"] if unknown else []))
            + f" (columns: {', '.join(COLUMNS)}; see docs/time.md)")
    df = df.assign(device=df["device"].astype(str))
    for c in df.columns[1:]:
        df[c] = pd.to_numeric(df[c], errors="coerce")
    order = list(dict.fromkeys(df["device"]))
    groups = {k: g for k, g in df.groupby("device", sort=False)}
    spans = df[["start", "end"]].dropna()
    if spans.empty:
        raise DataError(f"{path}: no row has an interval")
    lo, hi = float(spans["start"].min()), float(spans["end"].max())
    rows, windows, problems = [], [], []
    extra: dict[str, list[float]] = {c: [] for c in COLUMNS[5:]}
    for name in order:
        g = groups[name]
        iv = g[["start", "end"]]
        half = iv.isna().any(axis=1) & ~iv.isna().all(axis=1)
        if half.any():
            problems.append(f"{path}: device {name!r}: a row with start or end missing")
        rows.append(iv.dropna().to_numpy(np.float64).tolist())
        w0 = _one(g, "window_start", lo, problems, path, name)
        w1 = _one(g, "window_end", hi, problems, path, name)
        windows.append((w0, w1))
        for c in extra:
            extra[c].append(_one(g, c, np.nan, problems, path, name))
    if problems:
        raise DataError("; ".join(problems[:20]))
    cols = {c: (np.array(v) if c in df.columns else None) for c, v in extra.items()}
    return build_trace(order, rows, windows, cols["speed"], cols["up_mbps"],
                       cols["down_mbps"], source=f"raymm:{path.name}")


def _one(g: Any, column: str, default: float, problems: list[str], path: Path,
         name: str) -> float:
    """A per-device column's one value (`default` when absent or empty)."""
    if column not in g.columns:
        return float(default)
    vals = g[column].dropna().unique()
    if len(vals) > 1:
        problems.append(f"{path}: device {name!r}: {column} differs between its rows")
    return float(vals[0]) if len(vals) else float(default)


def write_raymm(trace: Trace, path: str | Path) -> Path:
    """`trace` as raymm's table (CSV, or Parquet by the suffix), one row per interval (a row
    without interval for an entry that has none), windows and hardware columns included."""
    # deferred: pandas loads only when a trace table is written
    import pandas as pd

    path = Path(path)
    counts = np.diff(trace.offsets)
    reps = np.maximum(counts, 1)
    e = np.repeat(np.arange(trace.entries), reps)
    starts = np.full(e.shape[0], np.nan)
    ends = np.full(e.shape[0], np.nan)
    has = np.repeat(counts > 0, reps)
    starts[has], ends[has] = trace.starts, trace.ends
    cols: dict[str, Any] = {"device": np.array(trace.names, dtype=object)[e], "start": starts,
                            "end": ends, "window_start": trace.window_start[e],
                            "window_end": trace.window_end[e]}
    for c in ("speed", "up_mbps", "down_mbps"):
        v = getattr(trace, c)
        if v is not None:
            cols[c] = v[e]
    df = pd.DataFrame(cols)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix.lower() in (".parquet", ".pq"):
        df.to_parquet(path, index=False)
    else:
        df.to_csv(path, index=False, float_format="%.17g")
    return path


def load_trace(kind: str, path: str | Path, capacity: str | Path | None = None) -> Trace:
    """A trace of `kind` (raymm, flash, fedscale) from `path` (FedScale: the behaviour
    pickle; `capacity` its device-capacity pickle)."""
    if kind == "flash":
        return load_flash(path)
    if kind == "fedscale":
        return load_fedscale(path, capacity)
    if kind == "raymm":
        return load_raymm(path)
    raise DataError(f"trace format {kind!r}: use one of {', '.join(FORMATS)}")


def trace_problems(spec: Any) -> list[str]:
    """What `raymm validate` says of `population.trace` (a `TraceSpec` or None) before any
    data is read: its files exist (relative paths under $RAYMM_DATA), capacity only for
    fedscale, a raymm table ends in .csv or .parquet."""
    if spec is None:
        return []
    problems = []
    files = [("path", spec.path)] + ([("capacity", spec.capacity)] if spec.capacity else [])
    for key, name in files:
        p = resolve_data_path(name)
        if not p.is_file():
            problems.append(f"population.trace.{key}: trace file not found: {p} (relative "
                            "paths are resolved under $RAYMM_DATA, else the working directory)")
    if spec.capacity is not None and spec.format != "fedscale":
        problems.append("population.trace.capacity: only format: fedscale has a capacity file")
    if spec.format == "raymm" and Path(spec.path).suffix.lower() not in (".csv", ".parquet",
                                                                         ".pq"):
        problems.append(f"population.trace.path: a raymm trace table ends in .csv or .parquet "
                        f"(got {spec.path!r})")
    return problems


def map_devices(n: int, trace: Trace, seed: int) -> np.ndarray:
    """int [n]: each device's trace entry, from its own seeded stream (independent of sensors
    and data): distinct entries while n fits the trace, drawn with replacement beyond."""
    rng = seeding.rng(seed, seeding.SETUP, seeding.SERVER, "trace")
    return rng.choice(trace.entries, size=n, replace=n > trace.entries).astype(np.int32)
