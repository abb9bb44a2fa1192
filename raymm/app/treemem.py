"""Memory of a process tree (the driver, Ray's daemons and workers), from /proc.

Two measures. PSS splits each shared page between the processes mapping it -- including
processes outside the tree (another torch program on the machine lowers the tree's PSS). The
resident set of the tree counts every physical page any of its processes maps once: private
pages, and shared pages (torch's libraries, a memory-mapped dataset, the object store) once
however many of the tree's processes map them, whatever runs beside it. It needs the page
frame numbers of /proc/PID/pagemap, which Linux shows only to a privileged reader; without
them it is None."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_PRESENT = np.uint64(1 << 63)
_PFN = np.uint64((1 << 55) - 1)


def tree_pids(root: int) -> list[int]:
    """`root` and every descendant alive now."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += children.get(pid, [])
    return out


def tree_pss_bytes(root: int) -> int:
    """Sum of PSS over `root` and its descendants (0 where /proc has none)."""
    total = 0
    for pid in tree_pids(root):
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1]) * 1024
                    break
        except OSError:
            continue
    return total


def _resident_areas(pid: int) -> list[tuple[int, int]]:
    """Address ranges of the mappings of `pid` with resident pages (smaps' Rss > 0)."""
    areas, current = [], None
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        head = line.split(None, 1)[0]
        if "-" in head and not head.endswith(":"):
            lo, hi = head.split("-")
            current = (int(lo, 16), int(hi, 16))
        elif head == "Rss:" and current is not None and int(line.split()[1]) > 0:
            areas.append(current)
    return areas


def _frames(pid: int) -> np.ndarray:
    """Page frame numbers of the resident pages of `pid` (zeros without the privilege)."""
    found = []
    with open(f"/proc/{pid}/pagemap", "rb") as f:
        for lo, hi in _resident_areas(pid):
            f.seek(lo // PAGE * 8)
            entries = np.frombuffer(f.read((hi - lo) // PAGE * 8), dtype=np.uint64)
            found.append(entries[(entries & _PRESENT) != 0] & _PFN)
    return np.concatenate(found) if found else np.zeros(0, np.uint64)


def tree_resident_bytes(root: int) -> int | None:
    """Bytes of the distinct physical pages mapped by `root` and its descendants; None when
    /proc hides the frame numbers (an unprivileged reader)."""
    frames = []
    for pid in tree_pids(root):
        try:
            frames.append(_frames(pid))
        except OSError:  # the process ended meanwhile, or its pagemap is not readable
            continue
    every = np.concatenate(frames) if frames else np.zeros(0, np.uint64)
    if every.size and not every.any():
        return None
    return int(np.unique(every).size) * PAGE
