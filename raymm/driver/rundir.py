"""The run directory: resolved config, TensorBoard events, Parquet tables, summary, and on
request (`export`) the rounds as CSV too.

Files that are rewritten during a run (tables, summary) are written to a temporary name and
renamed, so a crash never leaves a half-written file behind.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from raymm.config.strict_yaml import dump_yaml
from raymm.data.base import Dataset
from raymm.errors import RaymmError
from raymm.io.atomic import atomic_output
from raymm.io.paths import CONFIG_FILE, inside, name_problems
from raymm.population.availability import online_counts
from raymm.population.devices import Population
from raymm.protocol.record import RoundRecord
from raymm.units import GIB


def new_run_dir(root: str | Path, name: str) -> Path:
    """`root/<name>-<YYYYmmdd-HHMMSS>`, with a numeric suffix if that exists already."""

    if name_problems(name):  # validation refuses these first; a direct caller gets this
        raise RaymmError(name_problems(name)[0])
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = Path(root) / f"{name}-{stamp}"
    if not inside(Path(root), base):
        raise RaymmError(f"run directory {base} would not be inside {root}")
    path, i = base, 1
    while path.exists():
        path = base.with_name(f"{base.name}-{i}")
        i += 1
    path.mkdir(parents=True)
    return path


def named_run_dir(path: str | Path) -> Path:
    """`path` itself as a fresh run directory: created if absent, refused if it holds anything
    (a run is never written over another one's files)."""

    d = Path(path)
    d.mkdir(parents=True, exist_ok=True)
    if any(d.iterdir()):
        raise RaymmError(f"run directory {d} is not empty; a new run needs an empty one")
    return d


def atomic_write_bytes(path: Path, data: bytes) -> None:
    with atomic_output(path) as f:
        f.write(data)


def atomic_write_table(path: Path, table: pa.Table) -> None:
    with atomic_output(path) as f:
        pq.write_table(table, f)


def atomic_write_csv(path: Path, table: pa.Table) -> None:
    """`table` as CSV with a header line: nulls as empty fields, floats as Python writes them
    (they read back exactly), a list-valued cell as its Python text."""
    # deferred: pandas loads only for runs that export CSV
    import pandas as pd

    frame: pd.DataFrame = table.to_pandas()
    atomic_write_bytes(path, frame.to_csv(index=False).encode())


#: what `RunWriter(export=...)` can write beside rounds.parquet, and the file it writes
EXPORTS = {"csv": "rounds.csv"}


def export_formats(export: str | Sequence[str]) -> tuple[str, ...]:
    """The export formats asked for, each once; an unknown one is the user's mistake."""
    asked = (export,) if isinstance(export, str) else tuple(export)
    unknown = sorted(set(asked) - set(EXPORTS))
    if unknown:
        raise RaymmError(f"export: unknown format {', '.join(map(repr, unknown))}; choose "
                         f"from {', '.join(EXPORTS)}")
    return tuple(dict.fromkeys(asked))


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

    def __init__(self, path: Path, config: dict[str, Any] | None, tensorboard: bool = True,
                 rows: list[dict[str, Any]] | None = None, purge_step: int | None = None,
                 budget_gib: float | None = None, export: Sequence[str] = ()) -> None:
        """`config=None` continues an existing run: its config stays, `rows` are the history
        up to the checkpoint, and TensorBoard drops events from `purge_step` on (rounds that
        were logged after the checkpoint and are now run again). `export` names formats
        (`EXPORTS`) written beside rounds.parquet whenever it is."""
        self.path = path
        self.export = export_formats(export)
        self.rows: list[dict[str, Any]] = list(rows or [])
        self.selected: dict[int, np.ndarray] = {}
        self.class_names: tuple[str, ...] = ()
        self.budget_gib = budget_gib  # marked (B and B/2) on the accuracy-vs-traffic picture
        if config is not None:
            atomic_write_bytes(path / CONFIG_FILE,
                               dump_yaml(config).encode())
        self.tb = None
        if tensorboard:
            # deferred: TensorBoard loads only for runs that write its events
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(log_dir=str(path), purge_step=purge_step)

    def log_round(self, record: RoundRecord) -> None:
        """The record's row becomes a table row and TensorBoard scalars; its selected ids are
        kept (the availability picture, checkpoints) and its confusion matrix drawn."""
        row = record.row
        if record.selected is not None:
            self.selected[int(row["round"])] = np.asarray(record.selected)
        self.rows.append(row)
        if self.tb is None:
            return
        t = int(row["round"])
        if record.confusion is not None:
            self._eval_images(t, np.asarray(record.confusion))
        if record.device_epsilon is not None and np.isfinite(record.device_epsilon).all() \
                and record.device_epsilon.size:
            self.tb.add_histogram("privacy/device_epsilon", record.device_epsilon, t)
        for key, value in row.items():
            tag = TB_TAGS.get(key) or _dynamic_tag(key)
            if tag and isinstance(value, (int, float)) and math.isfinite(float(value)):
                self.tb.add_scalar(tag, float(value) / (GIB if key == "bytes_total" else 1.0), t)
        self._time_scalars(row)

    def _time_scalars(self, row: dict[str, Any]) -> None:
        """Under the seconds clock (a row with `sim_start_seconds`): the headline numbers again
        with the simulated second at the round's end as their step (TensorBoard's steps are
        integers), under `vs_sim_seconds/`."""
        if self.tb is None or "sim_start_seconds" not in row:
            return
        step = int(round(float(row["sim_seconds_total"])))
        for key in TIME_TAGS:
            value = row.get(key)
            if isinstance(value, (int, float)) and math.isfinite(float(value)):
                self.tb.add_scalar(f"vs_sim_seconds/{key}", float(value), step)

    def availability_over_time(self, population: Population, end_seconds: float,
                               bins: int = 200) -> None:
        """Devices available at the start of each of `bins` bins of simulated time over
        [0, end_seconds] (TensorBoard scalars `availability/online_devices`, step = second)."""
        if self.tb is None or end_seconds <= 0:
            return
        edges = np.linspace(0.0, end_seconds, bins, endpoint=False)
        counts = online_counts(population.availability, edges)
        for s, c in zip(edges, counts):
            self.tb.add_scalar("availability/online_devices", int(c), int(round(float(s))))

    # --- pictures ----------------------------------------------------------------------------
    def start_pictures(self, population: Population, dataset: Dataset, rounds: int) -> None:
        """Partition and availability pictures, and the custom-scalars layout (once per run)."""
        self.class_names = tuple(dataset.class_names) or tuple(
            str(c) for c in range(dataset.num_classes))
        if self.tb is None:
            return
        # deferred: matplotlib loads only when a picture is drawn
        from raymm.driver import pictures

        self.tb.add_custom_scalars(CUSTOM_SCALARS)
        ids = np.arange(min(population.n, pictures.MAX_ROWS))
        counts = np.stack([np.bincount(dataset.train.y[population.indices(int(i))],
                                       minlength=dataset.num_classes) for i in ids])
        self.tb.add_image("partition/labels_per_device",
                          pictures.to_image(pictures.label_heatmap(counts, self.class_names)),
                          0, dataformats="HWC")
        tiers = ["+".join(t) for t in population.tier_sensors]
        self.tb.add_image("partition/sensors_per_device", pictures.to_image(
            pictures.sensor_matrix(population.sensor_mask, population.sensors, tiers,
                                  population.tier)), 0, dataformats="HWC")
        self.tb.add_image("availability/online_timeline", pictures.to_image(
            pictures.availability_timeline(self.online_grid(population, ids, rounds))),
            0, dataformats="HWC")

    @staticmethod
    def online_grid(population: Population, ids: np.ndarray, rounds: int,
                    starts: Sequence[float] | None = None) -> np.ndarray:
        """bool [devices, rounds]: who was online in each round; with `starts` (the seconds
        clock's round start times) availability at those instants."""
        if starts is not None:
            return np.stack([population.availability.available(float(s), ids)
                             for s in starts[:rounds]], axis=1)
        return np.stack([population.online(t, ids) for t in range(1, rounds + 1)], axis=1)

    def end_pictures(self, population: Population, rounds: int) -> None:
        """The availability timeline with the devices actually selected each round."""
        if self.tb is None or not self.rows:
            return
        # deferred: matplotlib loads only when a picture is drawn
        from raymm.driver import pictures

        ids = np.arange(min(population.n, pictures.MAX_ROWS))
        done = int(self.rows[-1]["round"])
        starts = [float(r["sim_start_seconds"]) for r in self.rows] \
            if len(self.rows) == done and all("sim_start_seconds" in r for r in self.rows) \
            else None
        online = self.online_grid(population, ids, done, starts)
        chosen = np.zeros_like(online)
        for t, sel in self.selected.items():
            if 1 <= t <= done:
                chosen[np.intersect1d(sel, ids), t - 1] = True
        self.tb.add_image("availability/online_and_selected", pictures.to_image(
            pictures.availability_timeline(online, chosen & online)), done, dataformats="HWC")

    def _eval_images(self, t: int, confusion: np.ndarray) -> None:
        # deferred: matplotlib loads only when a picture is drawn
        from raymm.driver import pictures

        assert self.tb is not None
        evals = [r for r in self.rows if r.get("accuracy") is not None]
        gib = np.array([r["bytes_total"] / GIB for r in evals])
        acc = np.array([r["accuracy"] for r in evals])
        self.tb.add_image("curves/accuracy_vs_GiB", pictures.to_image(
            pictures.accuracy_vs_traffic({"this run": (gib, acc)}, self.budget_gib)), t,
            dataformats="HWC")
        self.tb.add_image("evaluation/confusion_matrix", pictures.to_image(
            pictures.confusion(confusion, self.class_names)), t, dataformats="HWC")

    def add_text(self, tag: str, text: str) -> None:
        if self.tb is not None:
            self.tb.add_text(tag, text, 0)

    def flush_rounds(self) -> None:
        table = rows_to_table(self.rows)
        atomic_write_table(self.path / "rounds.parquet", table)
        if "csv" in self.export:
            atomic_write_csv(self.path / EXPORTS["csv"], table)
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


CUSTOM_SCALARS = {
    "Accuracy": {
        "all sensors": ["Multiline", [r"accuracy/.*"]],
        "per tier (inputs restricted to the tier's sensors)": ["Multiline", [r"accuracy_tier/.*"]],
        "per sensor alone": ["Multiline", [r"accuracy_sensor/.*"]],
        "personal (each device, own model and adapter, own test part)":
            ["Multiline", [r"accuracy_personal/.*", r"accuracy_personal_tier/.*"]],
    },
    "Traffic": {
        "bytes per round": ["Multiline", [r"traffic/bytes_(up|down)"]],
        "cumulative GiB": ["Multiline", [r"traffic/cumulative_GiB"]],
    },
    "Time": {
        "seconds per round": ["Multiline", [r"time/.*"]],
    },
    "Selection": {
        "devices": ["Multiline", [r"devices/.*"]],
        "faults": ["Multiline", [r"faults/.*"]],
        "adaptive score weights (selection.weights: adaptive)":
            ["Multiline", [r"selection/(alpha|beta|gamma|participation)"]],
    },
    "Schedule": {
        "adaptive chain: phase and modality (sensor index, -1 = probe)":
            ["Multiline", [r"chain/phase", r"chain/modality"]],
        "adaptive chain: reported unimodal accuracy": ["Multiline", [r"chain/accuracy/.*"]],
        "adaptive chain: accuracy gain per training round": ["Multiline", [r"chain/gain_rate/.*"]],
    },
}

#: row columns also written against simulated seconds under the seconds clock
TIME_TAGS = ("accuracy", "train_loss", "online", "participated", "departed", "wasted_share")

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
    "failed": "faults/devices_crashed",
    "lost": "faults/devices_lost_with_actor",
    "stragglers": "faults/stragglers",
    "lockstep_fallbacks": "lockstep/fallbacks",
    "actors_killed": "faults/actors_killed",
    "sim_seconds": "time/sim_seconds_per_round",
    "wall_seconds": "time/wall_seconds_per_round",
    "best_accuracy": "accuracy/best",
    "acc_at_budget": "accuracy/at_budget",
    "acc_at_half_budget": "accuracy/at_half_budget",
    "tier_f1": "robustness/tier_f1",
    "worst_drop": "robustness/worst_drop",
    "acc_multimodal": "accuracy/multimodal_devices",
    "mir": "modality/MIR",
    # eval.scope: both: each device on its own test part, next to the pooled metrics
    "personal_accuracy": "accuracy_personal/all_devices",
    "personal_test_loss": "loss/test_personal",
    "personal_acc_multimodal": "accuracy_personal/multimodal_devices",
    "personal_mir": "modality/MIR_personal",
}


def _dynamic_tag(key: str) -> str | None:
    """Per-tier / per-sensor columns: `acc_tier/acc+gyro` -> `accuracy_tier/acc+gyro`."""
    prefix, _, rest = key.partition("/")
    if not rest:
        return None
    return {"acc_tier": "accuracy_tier", "acc_sensor": "accuracy_sensor",
            "acc_head": "accuracy_head", "acc_drop": "robustness_drop",
            "personal_acc_tier": "accuracy_personal_tier",
            "personal_acc_sensor": "accuracy_personal_sensor"}.get(prefix, prefix) + "/" + rest
