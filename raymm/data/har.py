"""Smartphone HAR: accelerometer + gyroscope windows `[128, 3]`, 6 activities, grouped by subject.

Reads either the repo's `.npz` (keys `{train,test}_{acc,gyro,y,subject}`) or the official
UCI-HAR folder (`<root>/{train,test}/Inertial Signals/*.txt`). Bad data always surfaces as a
`DataError` naming the file, never as a numpy/zipfile traceback. The default file,
`uci_har_hapt_raw_windows.npz`, is cut from the raw signals of the HAPT release by
`raymm data prepare hapt` (raymm/data/releases/hapt.py); `raymm data prepare uci-har` writes
the same layout from UCI-HAR v1 (raymm/data/releases/uci_har.py).
"""

from __future__ import annotations

import warnings
import zipfile
import zlib
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict

from raymm.data.base import (
    DataFacts,
    Dataset,
    Split,
    npz_shapes,
    open_npz,
    register_dataset,
    require_file,
    resolve_data_path,
)
from raymm.errors import DataError

SENSORS = ("acc", "gyro")
WINDOW, AXES, NUM_CLASSES = 128, 3, 6
CLASS_NAMES = ("WALKING", "WALKING_UPSTAIRS", "WALKING_DOWNSTAIRS", "SITTING", "STANDING", "LAYING")
# UCI-HAR file stem per sensor: total acceleration (gravity included) and body angular velocity.
_UCI_STEMS = {"acc": "total_acc", "gyro": "body_gyro"}
_READ_ERRORS = (zipfile.BadZipFile, zlib.error, ValueError, OSError, EOFError, KeyError)

RawSplit = tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]  # x, y (0-based), subject

def _check_split(src: Path, split: str, raw: RawSplit) -> None:
    """Shapes and label range, so a malformed file fails here and not deep inside training."""
    x, y, subject = raw
    if y.ndim != 1 or y.shape[0] == 0:
        raise DataError(f"{src}: {split} labels must be a non-empty 1-D array, got {y.shape}")
    n = y.shape[0]
    for s in SENSORS:
        if x[s].ndim != 3 or x[s].shape[1:] != (WINDOW, AXES):
            raise DataError(f"{src}: {split} {s} must be [n, {WINDOW}, {AXES}], got {x[s].shape}")
        if x[s].shape[0] != n:
            raise DataError(f"{src}: {split} {s} has {x[s].shape[0]} windows but y has {n} labels")
        if not np.isfinite(x[s]).all():
            raise DataError(f"{src}: {split} {s} holds non-finite values")
    if subject.shape != (n,):
        raise DataError(f"{src}: {split} subject must have shape ({n},), got {subject.shape}")
    if y.min() < 0 or y.max() >= NUM_CLASSES:
        raise DataError(f"{src}: {split} labels must lie in 0..{NUM_CLASSES - 1}")


def _read_npz(path: Path) -> tuple[dict[str, RawSplit], tuple[str, ...]]:
    try:
        with open_npz(path) as z:
            keys = [f"{sp}_{k}" for sp in ("train", "test") for k in (*SENSORS, "y", "subject")]
            missing = [k for k in keys if k not in z.files]
            if missing:
                raise DataError(f"{path}: missing key(s) {', '.join(missing)}")
            splits = {
                sp: (
                    {s: np.asarray(z[f"{sp}_{s}"], dtype=np.float32) for s in SENSORS},
                    np.asarray(z[f"{sp}_y"], dtype=np.int64),
                    np.asarray(z[f"{sp}_subject"], dtype=np.int64),
                )
                for sp in ("train", "test")
            }
            names = tuple(str(c) for c in z["class_names"]) if "class_names" in z.files else ()
    except _READ_ERRORS as e:
        raise DataError(f"{path}: unreadable or corrupt .npz ({type(e).__name__}: {e})") from e
    return splits, names


def _loadtxt(path: Path, dtype: type[np.generic], ndmin: Literal[1, 2]) -> np.ndarray:
    require_file(path, "har")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # an empty file warns; the shape check reports it
            return np.loadtxt(path, dtype=dtype, ndmin=ndmin)
    except (ValueError, OSError) as e:
        raise DataError(f"{path}: unreadable ({e})") from e


def _read_axes(sig: Path, stem: str, split: str) -> np.ndarray:
    """x, y, z files of one sensor stacked to `[n, 128, 3]`."""
    axes = [_loadtxt(sig / f"{stem}_{a}_{split}.txt", np.float32, 2) for a in "xyz"]
    if len({a.shape for a in axes}) != 1:
        shapes = ", ".join(str(a.shape) for a in axes)
        raise DataError(f"{sig}: {stem}_{{x,y,z}}_{split}.txt differ in shape ({shapes})")
    return np.stack(axes, axis=-1)


def _read_uci_split(root: Path, split: str) -> RawSplit:
    sig = root / split / "Inertial Signals"
    x = {s: _read_axes(sig, stem, split) for s, stem in _UCI_STEMS.items()}
    y = _loadtxt(root / split / f"y_{split}.txt", np.int64, 1) - 1  # UCI labels are 1..6
    subject = _loadtxt(root / split / f"subject_{split}.txt", np.int64, 1)
    return x, y, subject


def _read_uci_names(root: Path) -> tuple[str, ...]:
    """`activity_labels.txt` lines are `<id> <NAME>`; absent means the default names."""
    path = root / "activity_labels.txt"
    if not path.is_file():
        return ()
    rows = [line.split() for line in path.read_text().splitlines() if line.strip()]
    try:
        by_id = {int(r[0]): r[1] for r in rows if len(r) >= 2}
        return tuple(by_id[i] for i in range(1, NUM_CLASSES + 1))
    except (ValueError, KeyError) as e:
        raise DataError(f"{path}: expected lines '<1..6> <name>' ({e})") from e


def _standardize(train: dict[str, np.ndarray], test: dict[str, np.ndarray]) -> dict:
    """Per-channel z-scoring with TRAIN statistics only (no test leakage); in place."""
    stats = {}
    for s in SENSORS:
        mean = train[s].mean(axis=(0, 1), dtype=np.float64)
        std = np.maximum(train[s].std(axis=(0, 1), dtype=np.float64), 1e-8)
        for x in (train, test):
            x[s] = ((x[s] - mean) / std).astype(np.float32)
        stats[s] = {"mean": mean.tolist(), "std": std.tolist()}
    return stats


@register_dataset("har")
class HarLoader:
    """Loader for `dataset: {name: har}`; `path` is an .npz file or a UCI-HAR folder."""

    class Params(BaseModel):
        model_config = ConfigDict(extra="forbid")
        path: str = "uci_har_hapt_raw_windows.npz"
        standardize: bool = True

    def sensors(self, params: BaseModel) -> tuple[str, ...]:
        return SENSORS

    def required_files(self, params: BaseModel) -> list[Path]:
        assert isinstance(params, self.Params)
        return [resolve_data_path(params.path)]

    def facts(self, params: BaseModel) -> DataFacts | None:
        """From the .npz: the training labels' header and its subject column (a UCI-HAR
        folder, or a file that does not read, is left to loading, which says what is wrong)."""
        assert isinstance(params, self.Params)
        path = resolve_data_path(params.path)
        try:
            n_train = npz_shapes(path)["train_y"][0]
            with open_npz(path) as z:  # member sizes checked: a forged header allocates nothing
                groups = int(np.unique(z["train_subject"]).shape[0])
        except (*_READ_ERRORS, IndexError, DataError):
            return None
        return DataFacts(n_train, groups, {m: (WINDOW, AXES) for m in SENSORS}, NUM_CLASSES)

    def load(self, params: BaseModel, seed: int) -> Dataset:
        """`seed` is unused: the data and its subject split are fixed by the file."""
        assert isinstance(params, self.Params)
        path = require_file(resolve_data_path(params.path), "har")
        if path.is_dir():
            splits = {sp: _read_uci_split(path, sp) for sp in ("train", "test")}
            names = _read_uci_names(path)
        else:
            splits, names = _read_npz(path)
        for sp, raw in splits.items():
            _check_split(path, sp, raw)
        if names and len(names) != NUM_CLASSES:
            raise DataError(f"{path}: class_names has {len(names)} entries, expected {NUM_CLASSES}")
        (x_tr, y_tr, g_tr), (x_te, y_te, g_te) = splits["train"], splits["test"]
        stats = _standardize(x_tr, x_te) if params.standardize else {}
        return Dataset(
            name="har",
            sensors=SENSORS,
            num_classes=NUM_CLASSES,
            train=Split(x=x_tr, y=y_tr, group=g_tr),
            test=Split(x=x_te, y=y_te, group=g_te),
            class_names=names or CLASS_NAMES,
            meta={"source": str(path), "standardization": stats},
        )
