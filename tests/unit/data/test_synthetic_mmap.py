"""`synthetic_mmap` (raymm.data.synthetic_mmap): synthetic data of any size, generated once
into .npy files and mapped, equal to the in-memory arrays whatever the chunk size; an
incomplete folder is generated again, a corrupt file named, and clients must fit the rows."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from raymm.data import load_dataset
from raymm.data import synthetic_mmap as sm
from raymm.data.mapped import is_memory_mapped, maps_a_file
from raymm.errors import DataError

from helpers import mmap_params, same_arrays


def test_generated_once_mapped_and_equal_to_in_memory(tmp_path: Path) -> None:
    ds = load_dataset("synthetic_mmap", mmap_params(tmp_path), seed=4)
    folder = Path(ds.meta["folder"])
    assert isinstance(ds.train.x["a"], np.memmap) and is_memory_mapped(ds)
    assert ds.sensor_shape("b") == (4, 3) and ds.train.x["a"].dtype == np.float32
    assert ds.train.y.dtype == np.int64 and set(np.unique(ds.train.y)) == {0, 1, 2}
    # clients own runs of consecutive rows
    assert ds.train.group is not None and np.array_equal(ds.train.group,
                                                         np.repeat(np.arange(6), 100))
    stamp = {f.name: f.stat().st_mtime_ns for f in folder.iterdir()}
    again = load_dataset("synthetic_mmap", mmap_params(tmp_path), seed=4)
    assert {f.name: f.stat().st_mtime_ns for f in folder.iterdir()} == stamp   # not rewritten
    loaded = load_dataset("synthetic_mmap", mmap_params(tmp_path, mmap=False), seed=4)
    assert not is_memory_mapped(loaded) and not maps_a_file(loaded.train.x["a"])
    assert same_arrays(ds, again) and same_arrays(ds, loaded)
    # another seed is other data, in a folder of its own
    other = load_dataset("synthetic_mmap", mmap_params(tmp_path), seed=5)
    assert Path(other.meta["folder"]) != folder
    assert not np.array_equal(other.train.x["a"], ds.train.x["a"])
    # the size the loader states is what the files hold, headers aside
    on_disk = sum(f.stat().st_size for f in folder.glob("*.npy"))
    assert 0 < on_disk - sm.size_on_disk(sm.MappedParams(**mmap_params(tmp_path))) < 1024 * 8
    facts = sm.SyntheticMmapLoader().facts(sm.MappedParams(**mmap_params(tmp_path)))
    assert (facts.n_train, facts.groups, dict(facts.shapes)) == (600, 6, {"a": (5,),
                                                                          "b": (4, 3)})


def test_generation_does_not_depend_on_the_chunk_size(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    big = load_dataset("synthetic_mmap", mmap_params(tmp_path / "big"), seed=1)
    monkeypatch.setattr(sm, "CHUNK_BYTES", 40)   # two rows of `a` per step
    small = load_dataset("synthetic_mmap", mmap_params(tmp_path / "small"), seed=1)
    assert same_arrays(big, small)


def test_an_incomplete_folder_is_generated_again_and_a_corrupt_file_named(
        tmp_path: Path) -> None:
    ds = load_dataset("synthetic_mmap", mmap_params(tmp_path), seed=2)
    folder = Path(ds.meta["folder"])
    (folder / sm.DONE).unlink()          # interrupted before the end: made again
    assert same_arrays(load_dataset("synthetic_mmap", mmap_params(tmp_path), seed=2), ds)
    np.save(folder / "train_x0.npy", np.zeros((3, 5), np.float32))
    with pytest.raises(DataError, match="train_x0.npy.*expected float32 \\(600, 5\\)"):
        load_dataset("synthetic_mmap", mmap_params(tmp_path), seed=2)


def test_clients_must_fit_the_rows(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="clients"):
        sm.MappedParams(**mmap_params(tmp_path, clients=601))
