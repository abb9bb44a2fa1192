"""Datasets bigger than memory: arrays that are views of files.

A loader may return memory-mapped arrays (`np.load(path, mmap_mode="r")`, `np.memmap`, or
numpy views of a memory-mapped Arrow file with `Dataset.mapped` set). Then:

- the hosts turn them into tensors over the same memory (`tensor_view`), so training reads only
  the rows of the devices it trains, page by page from the file, and evaluation reads the test
  split a batch at a time;
- on Ray, the dataset does not travel: `for_workers` replaces it with a `DataSource` (the
  loader's name, its params, the seed and the data root, a few hundred bytes), and each actor
  opens the files itself (`received`). On one machine every actor maps the same files, so
  their pages are shared through the page cache. Opening checks a fingerprint of what the
  driver loaded (sizes, shapes, dtypes, the labels), so a loader that gives another process
  other data fails loudly instead of training on it.

What "memory" means for a mapped dataset: pages a process has read count in its resident set
(and in PSS, shared between the processes that read them) while they stay mapped; they are
clean page cache, which the kernel can drop at any time. A host lets go of the pages a round
read when the next round starts (`release_pages`, from `SequentialTrainer.start_round`), so
it keeps about one round's rows resident however long the run; the pages stay in the page
cache for whoever reads them next. Reading a row maps the block of the page cache around it
too (64 KiB, or a whole large folio of up to a few MiB on recent kernels), so rows a device
owns in one run of the file cost the least.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from pydantic import BaseModel

from raymm.data.base import DATASETS, Dataset, Split, data_root, data_root_at
from raymm.errors import DataError


def maps_a_file(a: Any) -> bool:
    """Whether `a` is a view of a memory map: an `np.memmap` (what `np.load` returns with
    `mmap_mode`), a slice of one, or any array whose memory an `mmap.mmap` holds."""
    seen = 0
    while a is not None and seen < 64:   # a chain of views ends at the memory's owner
        if isinstance(a, (np.memmap, mmap.mmap)):
            return True
        a, seen = getattr(a, "base", None), seen + 1
    return False


def _arrays(split: Split) -> Iterator[np.ndarray]:
    yield from split.x.values()
    yield split.y
    if split.group is not None:
        yield split.group


def is_memory_mapped(dataset: Dataset) -> bool:
    """Whether any array of the dataset is a view of a file (or the loader says so with
    `Dataset.mapped`): then it is opened in each process instead of being sent."""
    return dataset.mapped or any(maps_a_file(a) for split in (dataset.train, dataset.test)
                                 for a in _arrays(split))


def tensor_view(a: np.ndarray) -> torch.Tensor:
    """A tensor over the memory of `a` (never a copy), also for a read-only array, such as a
    file mapped with `mmap_mode="r"`: raymm only reads dataset tensors, so torch's warning that
    writing into one is undefined is not shown."""
    arr = np.asarray(a)
    if arr.flags.writeable:
        return torch.from_numpy(arr)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(arr)


def file_maps(split: Split) -> list[mmap.mmap]:
    """The memory maps (Python's `mmap.mmap`, as `np.load` and `np.memmap` make them) that the
    split's inputs are views of; none for arrays in memory or mapped by other means."""
    maps: dict[int, mmap.mmap] = {}
    for x in split.x.values():
        a: Any = x
        seen = 0
        while a is not None and seen < 64:
            if isinstance(a, mmap.mmap):
                maps[id(a)] = a
                break
            a, seen = getattr(a, "base", None), seen + 1
    return list(maps.values())


def release_pages(maps: list[mmap.mmap]) -> None:
    """Unmap from this process the pages of `maps` it has read (`MADV_DONTNEED`): they leave
    its resident set and stay in the page cache, and a later read maps them again. The data
    does not change: raymm never writes into a dataset's maps."""
    for m in maps:
        if not m.closed:
            m.madvise(mmap.MADV_DONTNEED)


def fingerprint(dataset: Dataset) -> str:
    """A digest of what must agree between two processes' copies of a dataset: its name,
    sensors and classes, every array's shape and dtype, and the labels (train and test `y`,
    `group`), which are small. The inputs themselves are not read."""
    h = hashlib.blake2b(digest_size=16)
    desc: dict[str, Any] = {"name": dataset.name, "sensors": list(dataset.sensors),
                            "classes": dataset.num_classes}
    for part, split in (("train", dataset.train), ("test", dataset.test)):
        desc[part] = {"x": {m: [list(x.shape), str(x.dtype)] for m, x in split.x.items()}}
        for key, label in (("y", split.y), ("group", split.group)):
            if label is not None:
                h.update(np.ascontiguousarray(label).view(np.uint8).reshape(-1).data)
                desc[part][key] = [list(label.shape), str(label.dtype)]
    h.update(json.dumps(desc, sort_keys=True).encode())
    return h.hexdigest()


@dataclass(frozen=True)
class DataSource:
    """A dataset as the loader call that opens it: what a Ray actor receives instead of the
    arrays of a memory-mapped dataset."""

    name: str
    params: dict[str, Any]
    seed: int
    #: the driver's data root, absolute: relative paths in `params` resolve as they did there
    root: str
    #: `fingerprint` of the driver's dataset
    digest: str

    def open(self) -> Dataset:
        """Load the dataset in this process and check it is the driver's."""
        loader = DATASETS.get(self.name)
        if loader is None:
            raise DataError(f"dataset {self.name!r}: no such loader in this process (known: "
                            f"{', '.join(sorted(DATASETS))}); a loader registered by a plugin "
                            "must be imported in every worker")
        with data_root_at(Path(self.root)):
            dataset = loader.load(loader.Params.model_validate(self.params), self.seed)
        if fingerprint(dataset) != self.digest:
            raise DataError(f"dataset {self.name!r} opened in this process differs from the "
                            "driver's (sizes, shapes or labels): its loader must give the same "
                            "data for the same params and seed, and every machine must see the "
                            "same files")
        return dataset


def for_workers(dataset: Dataset, name: str, params: BaseModel | dict[str, Any],
                seed: int) -> Dataset | DataSource:
    """What to send other processes for `dataset`, loaded as `name` with `params` and `seed`:
    the dataset itself when it lives in memory, a `DataSource` when it maps files (sending its
    arrays would copy the files whole, into Ray's object store)."""
    if not is_memory_mapped(dataset):
        return dataset
    raw = params.model_dump(mode="json") if isinstance(params, BaseModel) else dict(params)
    return DataSource(name, raw, seed, str(data_root().resolve()), fingerprint(dataset))


def received(sent: Dataset | DataSource) -> Dataset:
    """The dataset `for_workers` sent: opened here when it came as a `DataSource`."""
    return sent.open() if isinstance(sent, DataSource) else sent
