"""The process tree's resident set counts each physical page once: private pages of every
process, and a file's pages once however many processes of the tree map them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from raymm.app.treemem import tree_pids, tree_pss_bytes, tree_resident_bytes

MIB = 2**20
HOLD = """
import mmap, sys, time
size = int(sys.argv[1]) << 20
if sys.argv[2] == "anon":
    buf = bytearray(size)
    for i in range(0, size, 4096):
        buf[i] = 1
else:
    f = open(sys.argv[2], "rb")
    buf = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
    sum(buf[i] for i in range(0, size, 4096))
print("ready", flush=True)
time.sleep(60)
"""


LAUNCH = """
import subprocess, sys, time
procs = [subprocess.Popen([sys.executable, "-c", sys.argv[1], size, what],
                          stdout=subprocess.PIPE, text=True)
         for size, what in zip(sys.argv[2::2], sys.argv[3::2])]
for p in procs:
    p.stdout.readline()
print(" ".join(str(p.pid) for p in procs), flush=True)
time.sleep(60)
"""


def _launch(*holders: tuple[int, str]) -> tuple[subprocess.Popen[str], list[int]]:
    """A process holding children that each touch their memory: a tree of its own."""
    args = [a for size, what in holders for a in (str(size), what)]
    p = subprocess.Popen([sys.executable, "-c", LAUNCH, HOLD, *args], stdout=subprocess.PIPE,
                         text=True)
    assert p.stdout is not None
    return p, [int(x) for x in p.stdout.readline().split()]


def test_resident_set_counts_private_pages_and_shared_files_once(tmp_path: Path) -> None:
    if tree_resident_bytes(os.getpid()) is None:
        pytest.skip("/proc hides page frame numbers from this user (needs CAP_SYS_ADMIN)")
    data = tmp_path / "shared.bin"
    data.write_bytes(os.urandom(64 * MIB))
    root, kids = _launch((80, "anon"), (64, str(data)), (64, str(data)))
    try:
        assert set(tree_pids(root.pid)) == {root.pid, *kids}
        alone = [tree_resident_bytes(pid) or 0 for pid in kids]
        whole = tree_resident_bytes(root.pid) or 0
        # each holds what it touched on top of an interpreter (~10 MiB)
        assert 80 * MIB <= alone[0] < 110 * MIB
        assert 64 * MIB <= alone[1] < 94 * MIB and 64 * MIB <= alone[2] < 94 * MIB
        # the file's 64 MiB count once in the tree (and the interpreters' libraries): the
        # launcher's own few MiB do not make up for the second copy
        assert 80 * MIB + 64 * MIB <= whole < sum(alone) - 40 * MIB
        # PSS splits the file between its two mappers
        assert tree_pss_bytes(kids[1]) < alone[1] - 25 * MIB
    finally:
        for pid in kids:
            os.kill(pid, 9)
        root.kill()
