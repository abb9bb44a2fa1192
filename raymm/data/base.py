"""The dataset every loader produces, and the loader registry.

A dataset is a set of named sensors (modalities) that observe the same samples. Devices never
copy it: they hold index arrays into `Dataset.train`. An in-memory dataset is stored once in
Ray's object store; a memory-mapped one (see `Split`) stays in its files, and every process
that needs it maps them itself (`raymm.data.mapped`).
"""

from __future__ import annotations

import os
import zipfile
import zlib
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from numpy.lib import format as npy
from pydantic import BaseModel

from raymm.errors import DataError
from raymm.io.paths import special_file_problem


@dataclass(frozen=True)
class Split:
    """One split: `x[sensor]` is float32 `[n, *shape]`, `y` int64 `[n]`, `group` optional `[n]`
    (e.g. the subject each window came from).

    The arrays may live in memory or be views of files: `np.load(path, mmap_mode="r")`, an
    `np.memmap`, or zero-copy numpy views of a memory-mapped Arrow file (then set
    `Dataset.mapped`). raymm never writes into them and never copies a whole `x` array: a host
    reads the rows of its own devices, minibatch by minibatch, and evaluation reads the test
    split `eval.batch_size` rows at a time. The labels `y` and `group` are read whole (to
    partition the data, to count classes), so keep them small; they may be mapped too."""

    x: Mapping[str, np.ndarray]
    y: np.ndarray
    group: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.y.shape[0])


@dataclass(frozen=True)
class Dataset:
    """Train and test splits over the same sensors and classes."""

    name: str
    sensors: tuple[str, ...]
    num_classes: int
    train: Split
    test: Split
    class_names: tuple[str, ...] = ()
    meta: Mapping[str, Any] = field(default_factory=dict)
    #: optional training-time augmentation `augment(xb, held, gen) -> xb` (picklable; applied
    #: to every training minibatch with the stream (seed, round, device, "data_augment"))
    augment: Any = None
    #: the arrays are views of files by means raymm cannot see (e.g. a memory-mapped Arrow
    #: file): on Ray, every process opens the dataset itself instead of receiving the arrays.
    #: `np.memmap` and other `mmap`-backed arrays are recognised without it
    #: (`raymm.data.mapped.is_memory_mapped`)
    mapped: bool = False

    def sensor_shape(self, sensor: str) -> tuple[int, ...]:
        return tuple(self.train.x[sensor].shape[1:])


def dataset_problems(ds: object, loader: str, sensors: tuple[str, ...],
                     facts: DataFacts | None = None) -> list[str]:
    """What a loader's `Dataset` breaks of the contract (`Split`'s docstring), each naming the
    loader, the split, the sensor and the shapes: a loader from a plugin is checked before
    anything is built or written. Reads shapes, dtypes and the labels only."""
    where = f"dataset {loader!r}"
    if not isinstance(ds, Dataset):
        return [f"{where}: load() returned {type(ds).__name__}, not a raymm.data.base.Dataset"]
    out = []
    if tuple(ds.sensors) != tuple(sensors):
        out.append(f"{where}: load() gave sensors {list(ds.sensors)}, its sensors() "
                   f"said {list(sensors)}")
    for name, split in (("train", ds.train), ("test", ds.test)):
        y = np.asarray(split.y)
        if y.ndim != 1 or y.dtype.kind not in "iu":
            out.append(f"{where}: {name}.y must be integer labels [n], got {y.dtype} "
                       f"{list(y.shape)}")
            continue
        if y.size and (y.min() < 0 or y.max() >= ds.num_classes):
            out.append(f"{where}: {name}.y holds labels outside 0..{ds.num_classes - 1}")
        for m in ds.sensors:
            x = split.x.get(m)
            if x is None:
                out.append(f"{where}: {name}.x has no array for sensor {m!r}")
                continue
            if x.shape[:1] != y.shape:
                out.append(f"{where}: {name}.x[{m!r}] has {x.shape[0]} rows for {y.shape[0]} "
                           f"labels (shape {list(x.shape)})")
            if x.dtype.kind != "f":
                out.append(f"{where}: {name}.x[{m!r}] must be floating point, got {x.dtype}")
            if x.shape[1:] != ds.train.x.get(m, x).shape[1:]:
                out.append(f"{where}: {name}.x[{m!r}] samples are {list(x.shape[1:])}, the "
                           f"training split's are {list(ds.train.x[m].shape[1:])}")
            if facts is not None and m in facts.shapes and \
                    tuple(facts.shapes[m]) != tuple(x.shape[1:]):
                out.append(f"{where}: {name}.x[{m!r}] samples are {list(x.shape[1:])}; its "
                           f"facts() said {list(facts.shapes[m])} (validation used those)")
    return out


@dataclass(frozen=True)
class DataFacts:
    """What validation may know of a dataset without loading it (from its params, or from
    array headers and small label columns of its file): enough for every check building a run
    makes on the data's sizes (`raymm.population.partition.partition_problems`, the model's
    size)."""

    #: samples devices partition (`len(Dataset.train)`)
    n_train: int
    #: distinct `Dataset.train.group` values; None: the data has no groups
    groups: int | None
    #: `Dataset.sensor_shape` per sensor, in dataset order
    shapes: Mapping[str, tuple[int, ...]]
    num_classes: int


class DatasetLoader(Protocol):
    """What the registry holds per dataset name.

    `Params` validates the scenario's `dataset:` section; `sensors` and `required_files` are
    answered from the params alone so a scenario can be validated without loading any data.
    A loader may also answer `facts(params) -> DataFacts | None` (None: not known without
    loading), so `raymm validate` makes the checks on the data's sizes too.
    """

    Params: type[BaseModel]

    def sensors(self, params: BaseModel) -> tuple[str, ...]: ...

    def required_files(self, params: BaseModel) -> list[Path]: ...

    def load(self, params: BaseModel, seed: int) -> Dataset: ...


DATASETS: dict[str, DatasetLoader] = {}


def register_dataset(name: str) -> Callable[[type], type]:
    """Class decorator: register a loader class under `name` (one instance is stored)."""

    def deco(cls: type) -> type:
        DATASETS[name] = cls()
        return cls

    return deco


#: the data root a process was told to use (`data_root_at`), over `$RAYMM_DATA`
_ROOT: ContextVar[Path | None] = ContextVar("raymm_data_root", default=None)


def data_root() -> Path:
    """Where relative data paths are resolved: `$RAYMM_DATA`, else the working directory
    (inside `data_root_at(root)`: `root`)."""
    told = _ROOT.get()
    return told if told is not None else Path(os.environ.get("RAYMM_DATA", ".")).expanduser()


@contextmanager
def data_root_at(root: Path) -> Iterator[None]:
    """Resolve relative data paths under `root` inside the block: a Ray worker opening a
    dataset again finds the files the driver found, whatever its own environment and working
    directory."""
    token = _ROOT.set(root)
    try:
        yield
    finally:
        _ROOT.reset(token)


def resolve_data_path(path: str | os.PathLike[str]) -> Path:
    """Absolute paths stay; relative ones are taken under `data_root()`."""
    p = Path(path).expanduser()
    return p if p.is_absolute() else data_root() / p


def loader_facts(loader: Any, params: BaseModel) -> DataFacts | None:
    """The loader's `facts(params)` when it answers them (an optional hook), else None."""
    facts = getattr(loader, "facts", None)
    return None if facts is None else facts(params)


def npz_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """Array name -> shape of every member of an .npz, read from the headers only; a
    DataError for a path that is missing or no regular file (a FIFO would block the read)."""

    require_file(path, "dataset")
    shapes = {}
    with zipfile.ZipFile(path) as archive:
        for info in archive.infolist():
            if info.filename.endswith(".npy"):
                with archive.open(info) as f:
                    version = npy.read_magic(f)
                    shape, _, _ = (npy.read_array_header_1_0(f) if version == (1, 0)
                                   else npy.read_array_header_2_0(f))
                shapes[info.filename[:-4]] = tuple(int(d) for d in shape)
    return shapes


def require_file(path: Path, what: str) -> Path:
    """`path` if it is a file or folder to read; a FIFO or device (reading one blocks or never
    ends) or a missing path is a DataError."""

    if not path.exists():
        hint = "" if "RAYMM_DATA" in os.environ else " (set RAYMM_DATA to the data folder)"
        raise DataError(f"{what}: file not found: {path}{hint}")
    problem = special_file_problem(path, what)
    if problem:
        raise DataError(problem)
    return path



_NPZ_ERRORS = (zipfile.BadZipFile, zlib.error, ValueError, OSError, EOFError)


def open_npz(path: Path) -> np.lib.npyio.NpzFile:
    """`np.load(path, allow_pickle=False)` when it is an .npz archive (use it as a context
    manager); a DataError naming the file otherwise: a pickle, a truncated or foreign file, or
    a single `.npy` array, which np.load returns as a plain array."""
    require_file(path, "dataset")
    try:
        z = np.load(path, allow_pickle=False)
    except _NPZ_ERRORS as e:
        raise DataError(f"{path}: unreadable or corrupt .npz ({type(e).__name__}: {e})") from e
    if not isinstance(z, np.lib.npyio.NpzFile):
        raise DataError(f"{path}: not an .npz archive (it holds a single array)")
    try:
        _check_member_sizes(z, path)
    except BaseException:
        z.close()
        raise
    return z


def _check_member_sizes(z: np.lib.npyio.NpzFile, path: Path) -> None:
    """Every array's header must fit its member: numpy allocates what a header claims before
    reading, so a forged header (a 1.4 TiB array in a few bytes) would exhaust memory."""

    archive = z.zip
    assert archive is not None, "an NpzFile only lacks its zip once closed"
    for info in archive.infolist():
        if not info.filename.endswith(".npy"):
            continue
        try:
            with archive.open(info) as f:
                version = npy.read_magic(f)
                shape, _, dtype = (npy.read_array_header_1_0(f) if version == (1, 0)
                                   else npy.read_array_header_2_0(f))
                header = f.tell() if f.seekable() else 0
        except _NPZ_ERRORS as e:
            raise DataError(f"{path}: {info.filename}: unreadable array header ({e})") from e
        claimed = int(np.prod(shape, dtype=object)) * dtype.itemsize
        if claimed > info.file_size - header:
            raise DataError(f"{path}: {info.filename} claims {claimed:,} bytes of data but holds "
                            f"{info.file_size - header:,}: the file is corrupt or forged")
