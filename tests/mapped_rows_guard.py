"""A host over memory-mapped inputs whose rows outside the host's devices cannot be read.

Used by tests/unit/data/test_mapped.py, in a process of its own:

    python tests/mapped_rows_guard.py TMP_DIR sequential|lockstep|fedmchain [--read-outside]

Every sensor's training inputs are copied into a file and mapped read-only, one row per page;
`mprotect` then makes every page that holds no row of the host's devices (their training rows
and their local test rows) unreadable. The host is built, warmed up, trains three rounds of
the server's plans and evaluates its devices (`fedmchain`: sequentially, under a method whose
devices also report their accuracy per sensor on their own rows before training). A read of
any other row kills the process with SIGSEGV. `--read-outside` reads one such row on purpose
(the control).
"""

from __future__ import annotations

import ctypes
import mmap
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

from raymm.app.build import build_world, load_scenario
from raymm.device.lockstep_host import make_host
from raymm.device.warmup import warm_up
from raymm.server.server import Server

from helpers import tiny_scenario  # the script's folder, tests/, is first on sys.path

PAGE = mmap.PAGESIZE
DIM = PAGE // 4          # float32 features: one row is one page
PROT_NONE = 0
#: an adaptive chain: the round-1 participants report their accuracy per sensor (on their rows)
CHAIN = {"method": "fedmchain", "schedule.order": "adaptive", "schedule.probe_rounds": 1,
         "schedule.phases": 2}


def mapped_copy(a: np.ndarray, path: Path) -> np.memmap:
    """`a` in a file, mapped read-only (a file mapping starts on a page)."""
    w = np.memmap(path, dtype=np.float32, mode="w+", shape=a.shape)
    w[:] = a
    w.flush()
    del w
    return np.memmap(path, dtype=np.float32, mode="r", shape=a.shape)


def protect_all_but(a: np.memmap, keep: np.ndarray) -> int:
    """Make the pages of every row of `a` not in `keep` unreadable; returns how many."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    base = a.__array_interface__["data"][0]
    assert base % PAGE == 0 and a.strides[0] == PAGE, (base, a.strides)
    kept = np.zeros(a.shape[0], bool)
    kept[keep] = True
    n, r, closed = a.shape[0], 0, 0
    while r < n:
        if kept[r]:
            r += 1
            continue
        start = r
        while r < n and not kept[r]:
            r += 1
        if libc.mprotect(base + start * PAGE, (r - start) * PAGE, PROT_NONE) != 0:
            raise OSError(ctypes.get_errno(), "mprotect")
        closed += r - start
    return closed


def main() -> None:
    tmp, mode = Path(sys.argv[1]), sys.argv[2]
    sc = load_scenario(tiny_scenario(**{
        "dataset.n_train": 600, "dataset.n_test": 60,
        "dataset.sensors": {"a": {"dim": DIM, "informativeness": 0.2},
                            "b": {"dim": DIM, "informativeness": 0.1}},
        # rows spread over the whole file, and local test rows per device
        "population.partition": {"kind": "iid"}, "population.local_test_fraction": 0.25,
        "selection.k": 4,
        "execution.training.path": "lockstep" if mode == "lockstep" else "sequential",
        **(CHAIN if mode == "fedmchain" else {})}))
    world = build_world(sc)
    ds, pop = world.dataset, world.population
    x = {m: mapped_copy(ds.train.x[m], tmp / f"{m}.f32") for m in ds.sensors}
    data = replace(ds, train=replace(ds.train, x=x))
    server = Server(sc, data, pop, world.policies)
    ids = np.arange(pop.n // 2)                      # this host: the first half of the devices
    rows = np.concatenate([np.concatenate([pop.indices(d), pop.test_indices_of(d)])
                           for d in ids]).astype(np.int64)
    closed = sum(protect_all_but(a, rows) for a in x.values())
    print(f"{len(rows)} rows readable, {closed} pages closed", flush=True)
    if "--read-outside" in sys.argv:
        other = int(np.setdiff1d(np.arange(len(ds.train)), rows)[0])
        print("read", float(x["a"][other, 0]), flush=True)
    host = make_host(ids, pop, data, world.host_spec)
    warm_up(host)
    trained = 0
    for t in range(1, 4):
        plan, broadcast = server.plan(t, [host.report_online(t)])
        result = host.train(plan, broadcast)
        server.aggregate(t, plan, [result], None)
        trained += len(host.selected(plan))
    print(f"trained {trained} device rounds", flush=True)
    metrics = server.device_metrics([host.evaluate_devices(server.eval_payload(3))])
    print(f"evaluated {len(metrics)} metrics", flush=True)


if __name__ == "__main__":
    main()
