"""`synthetic_mmap`: synthetic multimodal data of any size, kept in .npy files and mapped.

The first load generates the files under `path/<key>/` (`key` is a digest of the seed and the
params that shape the data), chunk by chunk: a few MiB of samples at a time are drawn and
written, never a whole array, so a dataset many times the machine's memory can be made. Later
loads, in this or any process, find the files and map them (`np.load(..., mmap_mode="r")`), or
with `mmap: false` read them whole into memory (the same numbers, for comparison).

The data is the `synthetic` loader's model: per sensor a class mean `signal[y]` plus unit
Gaussian noise, drawn from the sensor's own generator `[seed, crc32(name)]`; labels balanced and
shuffled. The training rows come in `clients` runs of consecutive rows (`Split.group` says
whose): `population.partition: {kind: by_group}` with `population.devices: <clients>` gives
each device one run of the file, which is what reading only a device's rows needs to touch the
fewest pages.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from numpy.lib import format as npy
from pydantic import BaseModel, ConfigDict, Field, model_validator

from raymm.data.base import DataFacts, Dataset, Split, register_dataset, resolve_data_path
from raymm.data.synthetic import _LABELS_KEY, SensorSpec, _class_signal, _labels, _rng
from raymm.errors import DataError
from raymm.io.atomic import atomic_output

log = logging.getLogger("raymm.data.synthetic_mmap")

#: bytes of samples drawn and written per step
CHUNK_BYTES = 8 << 20
#: the layout of the generated folder; a change of it makes a new key
FORMAT = 1
#: written last: the folder is complete when it exists
DONE = "done.json"


def _default_sensors() -> dict[str, SensorSpec]:
    return {"a": SensorSpec(dim=256, informativeness=0.3),
            "b": SensorSpec(dim=256, informativeness=0.15)}


class MappedParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: str = Field("synthetic_mmap", description="folder the files are generated in "
                                                    "(relative: under RAYMM_DATA)")
    classes: int = Field(6, ge=2)
    n_train: int = Field(100_000, ge=1)
    n_test: int = Field(2_000, ge=1)
    clients: int = Field(100, ge=1, description="runs of consecutive training rows "
                                                "(`Split.group`)")
    sensors: dict[str, SensorSpec] = Field(default_factory=_default_sensors, min_length=1)
    mmap: bool = Field(True, description="map the files (false: read them into memory)")

    @model_validator(mode="after")
    def _clients_fit(self) -> MappedParams:
        if self.clients > self.n_train:
            raise ValueError(f"clients ({self.clients}) > n_train ({self.n_train}): every "
                             "client needs a training row")
        return self


def _shape(spec: SensorSpec) -> tuple[int, ...]:
    return (spec.dim,) if spec.length is None else (spec.length, spec.dim)


def data_key(p: MappedParams, seed: int) -> str:
    """The folder name of the files `p` and `seed` generate: what shapes the arrays (not the
    path, not `clients`, which only groups rows, not `mmap`)."""
    what = {"format": FORMAT, "seed": seed, "classes": p.classes, "n_train": p.n_train,
            "n_test": p.n_test, "sensors": {m: s.model_dump() for m, s in p.sensors.items()}}
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16]


def _files(p: MappedParams) -> dict[str, tuple[str, tuple[int, ...], str]]:
    """file name -> (split, shape, dtype); sensors by position (a sensor's name need not be a
    valid file name)."""
    out: dict[str, tuple[str, tuple[int, ...], str]] = {
        "train_y.npy": ("train", (p.n_train,), "<i8"),
        "test_y.npy": ("test", (p.n_test,), "<i8")}
    for i, spec in enumerate(p.sensors.values()):
        out[f"train_x{i}.npy"] = ("train", (p.n_train, *_shape(spec)), "<f4")
        out[f"test_x{i}.npy"] = ("test", (p.n_test, *_shape(spec)), "<f4")
    return out


def size_on_disk(p: MappedParams) -> int:
    """Bytes of the generated files (headers aside)."""
    return sum(int(np.prod(shape)) * np.dtype(dt).itemsize for _, shape, dt in
               _files(p).values())


def _write(path: Path, dtype: str, shape: tuple[int, ...], chunks: Iterator[np.ndarray]) -> None:
    """An .npy file written chunk by chunk (rows in order), atomically."""
    with atomic_output(path) as f:
        npy.write_array_header_1_0(f, {"descr": dtype, "fortran_order": False,
                                       "shape": shape})
        rows = 0
        for chunk in chunks:
            f.write(np.ascontiguousarray(chunk, dtype=dtype).data)
            rows += chunk.shape[0]
        assert rows == shape[0], (path, rows, shape)


def _sensor_chunks(rng: np.random.Generator, signal: np.ndarray, y: np.ndarray
                   ) -> Iterator[np.ndarray]:
    """float32 `signal[y] + N(0, 1)`, a few MiB of rows at a time, drawn in row order."""
    row = int(np.prod(signal.shape[1:])) * 4
    step = max(1, CHUNK_BYTES // row)
    for lo in range(0, y.size, step):
        hi = min(lo + step, y.size)
        noise = rng.standard_normal((hi - lo, *signal.shape[1:]), dtype=np.float32)
        noise += signal[y[lo:hi]]
        yield noise


def generate(p: MappedParams, seed: int, folder: Path) -> None:
    """Write every file of the dataset into `folder`, then `done.json`."""
    need = size_on_disk(p)
    folder.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(folder).free
    if free < need:
        raise DataError(f"synthetic_mmap: {need / 2**30:.2f} GiB to write in {folder}, "
                        f"{free / 2**30:.2f} GiB free")
    log.info("generating %.2f GiB of synthetic data in %s", need / 2**30, folder)
    lab = _rng(seed, _LABELS_KEY)
    y = {"train": _labels(lab, p.n_train, p.classes), "test": _labels(lab, p.n_test, p.classes)}
    for part in ("train", "test"):
        _write(folder / f"{part}_y.npy", "<i8", y[part].shape, iter([y[part]]))
    for i, (name, spec) in enumerate(p.sensors.items()):
        rng = _rng(seed, name)
        signal = _class_signal(rng, spec, p.classes).astype(np.float32)
        for part in ("train", "test"):   # one generator, train's draws then test's
            _write(folder / f"{part}_x{i}.npy", "<f4", (y[part].size, *_shape(spec)),
                   _sensor_chunks(rng, signal, y[part]))
    with atomic_output(folder / DONE) as f:
        f.write(json.dumps({"format": FORMAT, "seed": seed, "bytes": need,
                            "sensors": list(p.sensors)}).encode())


def _open(path: Path, shape: tuple[int, ...], dtype: str, mmap: bool) -> np.ndarray:
    try:
        a = np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
    except (OSError, ValueError, EOFError) as e:
        raise DataError(f"{path}: unreadable ({e}); delete {path.parent} to generate it "
                        "again") from e
    if a.shape != shape or a.dtype != np.dtype(dtype):
        raise DataError(f"{path}: {a.dtype} {a.shape}, expected {np.dtype(dtype)} {shape}; "
                        f"delete {path.parent} to generate it again")
    return a


@register_dataset("synthetic_mmap")
class SyntheticMmapLoader:
    """Loader for `dataset: {name: synthetic_mmap}`."""

    Params = MappedParams

    def sensors(self, params: BaseModel) -> tuple[str, ...]:
        assert isinstance(params, MappedParams)
        return tuple(params.sensors)

    def required_files(self, params: BaseModel) -> list[Path]:
        return []   # generated on first load

    def facts(self, params: BaseModel) -> DataFacts:
        assert isinstance(params, MappedParams)
        return DataFacts(params.n_train, params.clients,
                         {m: _shape(s) for m, s in params.sensors.items()}, params.classes)

    def folder(self, params: MappedParams, seed: int) -> Path:
        return resolve_data_path(params.path) / data_key(params, seed)

    def load(self, params: BaseModel, seed: int) -> Dataset:
        assert isinstance(params, MappedParams)
        p = params
        folder = self.folder(p, seed)
        if not (folder / DONE).is_file():
            generate(p, seed, folder)
        arrays = {name: _open(folder / name, shape, dt, p.mmap)
                  for name, (_, shape, dt) in _files(p).items()}
        names = list(p.sensors)
        # client c owns training rows [c*n//clients, (c+1)*n//clients)
        bounds = np.arange(p.clients + 1, dtype=np.int64) * p.n_train // p.clients
        group = np.repeat(np.arange(p.clients, dtype=np.int64), np.diff(bounds))
        return Dataset(
            name="synthetic_mmap", sensors=tuple(names), num_classes=p.classes,
            train=Split(x={m: arrays[f"train_x{i}.npy"] for i, m in enumerate(names)},
                        y=arrays["train_y.npy"], group=group),
            test=Split(x={m: arrays[f"test_x{i}.npy"] for i, m in enumerate(names)},
                       y=arrays["test_y.npy"]),
            class_names=tuple(str(c) for c in range(p.classes)),
            meta={"folder": str(folder), "bytes": size_on_disk(p)})
