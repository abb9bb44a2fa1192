"""Datasets bigger than memory (raymm.data.mapped): what travels to other processes instead of
the arrays, tensor views, pages let go between rounds, and a host that reads only its own
devices' rows."""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import warnings
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from raymm.app.build import build_world, load_scenario
from raymm.data import load_dataset
from raymm.data.base import Dataset, Split
from raymm.data.mapped import (
    DataSource,
    file_maps,
    for_workers,
    is_memory_mapped,
    received,
    release_pages,
    tensor_view,
)
from raymm.device.host import DeviceHost
from raymm.errors import DataError
from raymm.protocol.messages import Broadcast, RoundPlan
from raymm.server.server import Server

from helpers import REPO, mmap_params, same_arrays, tiny_scenario


def test_a_mapped_dataset_travels_as_its_loader_call(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAYMM_DATA", str(tmp_path))
    raw = mmap_params(Path("rel"))                     # relative: under the data root
    ds = load_dataset("synthetic_mmap", raw, seed=3)
    sent = for_workers(ds, "synthetic_mmap", raw, 3)
    assert isinstance(sent, DataSource) and len(pickle.dumps(sent)) < 2048
    # another process with another data root and working directory opens the same files
    monkeypatch.setenv("RAYMM_DATA", str(tmp_path / "elsewhere"))
    monkeypatch.chdir(tmp_path.parent)
    back = received(pickle.loads(pickle.dumps(sent)))
    assert is_memory_mapped(back) and back.meta["folder"] == ds.meta["folder"]
    assert same_arrays(back, ds)
    # an in-memory dataset travels as it is
    loaded = load_dataset("synthetic_mmap", {**raw, "mmap": False}, seed=3)
    assert for_workers(loaded, "synthetic_mmap", {**raw, "mmap": False}, 3) is loaded
    assert received(loaded) is loaded


def test_a_worker_that_opens_other_data_fails(tmp_path: Path) -> None:
    ds = load_dataset("synthetic_mmap", mmap_params(tmp_path), seed=3)
    sent = for_workers(ds, "synthetic_mmap", mmap_params(tmp_path), 3)
    assert isinstance(sent, DataSource)
    with pytest.raises(DataError, match="differs from the driver's"):
        replace(sent, seed=4).open()         # the loader gives other data for another seed
    with pytest.raises(DataError, match="no such loader"):
        replace(sent, name="nope").open()


def test_a_loader_may_declare_its_arrays_mapped() -> None:
    x = {"a": np.zeros((4, 2), np.float32)}
    split = Split(x=x, y=np.zeros(4, np.int64))
    ds = Dataset("d", ("a",), 2, split, split)
    assert not is_memory_mapped(ds) and is_memory_mapped(replace(ds, mapped=True))


def test_tensor_view_shares_memory_without_a_warning(tmp_path: Path) -> None:
    path = tmp_path / "x.npy"
    np.save(path, np.arange(12, dtype=np.float32).reshape(4, 3))
    a = np.load(path, mmap_mode="r")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        t = tensor_view(a[1:3])
    assert t.data_ptr() == a[1:3].__array_interface__["data"][0]
    assert torch.equal(t, torch.tensor([[3.0, 4, 5], [6, 7, 8]]))


def resident_kib(path: Path) -> int:
    """KiB of `path`'s pages mapped into this process (its mappings' Rss in /proc/self/smaps)."""
    total, ours = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if head and "-" in head[0] and len(head) >= 5:       # a mapping's first line
            ours = len(head) >= 6 and head[5] == str(path)
        elif ours and head[0] == "Rss:":
            total += int(head[1])
    return total


def test_a_new_round_lets_go_of_the_pages_the_last_one_read(tmp_path: Path) -> None:
    ds = load_dataset("synthetic_mmap", mmap_params(tmp_path, n_train=6000, clients=6), seed=1)
    maps = file_maps(ds.train)
    assert len(maps) == 2 and file_maps(ds.test) and not file_maps(
        load_dataset("synthetic_mmap", mmap_params(tmp_path, mmap=False), seed=1).train)
    path = Path(ds.meta["folder"]) / "train_x0.npy"
    total = float(np.asarray(ds.train.x["a"]).sum())           # every page read
    assert resident_kib(path) > 100
    release_pages(maps)
    assert resident_kib(path) == 0
    assert float(np.asarray(ds.train.x["a"]).sum()) == total   # read again, unchanged


def test_a_host_keeps_resident_only_the_rows_of_its_current_round(tmp_path: Path) -> None:
    sc = load_scenario(tiny_scenario(**{
        "dataset": {"name": "synthetic_mmap", **mmap_params(
            tmp_path, n_train=6000, clients=6,
            sensors={"a": {"dim": 1024, "informativeness": 1.0}})},
        "population.devices": 6, "population.tiers": [{"sensors": ["a"], "count": 6}],
        "population.partition": {"kind": "by_group"}}))
    world = build_world(sc)
    host = DeviceHost(np.arange(6), world.population, world.dataset, world.host_spec)
    server = Server(sc, world.dataset, world.population, world.policies)
    path = Path(world.dataset.meta["folder"]) / "train_x0.npy"
    device_kib = 1000 * 1024 * 4 // 1024                # one client's rows: 4000 KiB

    def train(t: int, devices: list[int]) -> int:
        host.train(RoundPlan(t, np.array(devices), tuple(server.layout.groups)),
                   Broadcast(t, server.params, {}))
        return resident_kib(path)

    assert train(1, [0, 1, 2]) >= 3 * device_kib
    # the kernel maps whole blocks of the page cache around what is read (64 KiB, or a large
    # folio of up to 2 MiB): at most one on either side of the device's rows
    assert device_kib <= train(2, [5]) <= device_kib + 2 * 2048


# ------------------------------------------------------------- a host reads its rows only

GUARD = REPO / "tests" / "mapped_rows_guard.py"


def _guard(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
    return subprocess.run([sys.executable, str(GUARD), str(tmp_path), *args],
                          capture_output=True, text=True, timeout=300, cwd=REPO, env=env)


@pytest.mark.parametrize("mode", ["sequential", "lockstep", "fedmchain"])
def test_a_host_reads_only_its_own_devices_rows(tmp_path: Path, mode: str) -> None:
    """Every page of the mapped inputs outside the rows of a host's devices is made unreadable
    (mprotect); the host is built, trains several rounds and evaluates its devices. Reading any
    other row would kill the process with SIGSEGV."""
    proc = _guard(tmp_path, mode)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "trained" in proc.stdout and "evaluated" in proc.stdout


def test_the_guard_catches_a_read_outside_the_rows(tmp_path: Path) -> None:
    """The control: the same guard kills a process that reads a row of another host."""
    proc = _guard(tmp_path, "sequential", "--read-outside")
    assert proc.returncode == -signal.SIGSEGV, proc.stdout[-2000:] + proc.stderr[-2000:]
