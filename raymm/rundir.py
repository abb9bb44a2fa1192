"""The run directory: resolved config, TensorBoard events, Parquet tables, summary.

Files that are rewritten during a run (tables, summary) are written to a temporary name and
renamed, so a crash never leaves a half-written file behind.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import yaml

GIB = float(1 << 30)


def new_run_dir(root: str | Path, name: str) -> Path:
    """`root/<name>-<YYYYmmdd-HHMMSS>`, with a numeric suffix if that exists already."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = Path(root) / f"{name}-{stamp}"
    path, i = base, 1
    while path.exists():
        path = base.with_name(f"{base.name}-{i}")
        i += 1
    path.mkdir(parents=True)
    return path


def atomic_write_bytes(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def atomic_write_table(path: Path, table: pa.Table) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    pq.write_table(table, tmp)
    os.replace(tmp, path)


def rows_to_table(rows: list[dict[str, Any]]) -> pa.Table:
    """Rows with possibly different keys -> one table; missing values become null."""
    cols: list[str] = []
    for r in rows:
        cols += [k for k in r if k not in cols]
    return pa.table({c: [r.get(c) for r in rows] for c in cols})


def _jsonable(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, np.generic):
        return _jsonable(v.item())
    return v


class RunWriter:
    """Writes one run's files. TensorBoard is optional (`tensorboard: false`)."""

    def __init__(self, path: Path, config: dict[str, Any], tensorboard: bool = True) -> None:
        self.path = path
        self.rows: list[dict[str, Any]] = []
        atomic_write_bytes(path / "config.yaml", yaml.safe_dump(config, sort_keys=False).encode())
        self.tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(log_dir=str(path))

    def log_round(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        if self.tb is None:
            return
        t = int(row["round"])
        for key, value in row.items():
            tag = TB_TAGS.get(key) or _dynamic_tag(key)
            if tag and isinstance(value, (int, float)) and math.isfinite(float(value)):
                self.tb.add_scalar(tag, float(value) / (GIB if key == "bytes_total" else 1.0), t)

    def add_text(self, tag: str, text: str) -> None:
        if self.tb is not None:
            self.tb.add_text(tag, text, 0)

    def flush_rounds(self) -> None:
        atomic_write_table(self.path / "rounds.parquet", rows_to_table(self.rows))
        if self.tb is not None:
            self.tb.flush()

    def write_devices(self, table: pa.Table) -> None:
        atomic_write_table(self.path / "devices.parquet", table)

    def write_summary(self, summary: dict[str, Any]) -> None:
        data = {k: _jsonable(v) for k, v in summary.items()}
        atomic_write_bytes(self.path / "summary.json",
                           (json.dumps(data, indent=2) + "\n").encode())

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()


TB_TAGS = {
    "accuracy": "accuracy/all_sensors",
    "test_loss": "loss/test",
    "train_loss": "loss/train",
    "bytes_up": "traffic/bytes_up",
    "bytes_down": "traffic/bytes_down",
    "bytes_total": "traffic/cumulative_GiB",
    "online": "devices/online",
    "eligible": "devices/eligible",
    "selected": "devices/selected",
    "participated": "devices/participated",
    "failed": "devices/failed",
    "sim_seconds": "time/sim_seconds_per_round",
    "wall_seconds": "time/wall_seconds_per_round",
    "acc_multimodal": "accuracy/multimodal_devices",
    "mir": "modality/MIR",
}


def _dynamic_tag(key: str) -> str | None:
    """Per-tier / per-sensor columns: `acc_tier/acc+gyro` -> `accuracy_tier/acc+gyro`."""
    prefix, _, rest = key.partition("/")
    if not rest:
        return None
    return {"acc_tier": "accuracy_tier", "acc_sensor": "accuracy_sensor"}.get(prefix,
                                                                             prefix) + "/" + rest
