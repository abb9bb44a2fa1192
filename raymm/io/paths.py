"""Paths and names that cannot hurt: a run name that stays inside `--out`, files that are
regular files (a FIFO or a device is refused before it is read), writable output folders.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import Any

#: a run directory's scenario, the first file written into it: a folder holding it is a run
#: directory (a run's other files: `raymm.driver.rundir`)
CONFIG_FILE = "config.yaml"
#: run names: letters, digits, `.`, `_`, `-`, starting with a letter or digit; the run
#: directory `<name>-<YYYYmmdd-HHMMSS>[-n]` then stays well under a file name's 255 bytes
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
NAME_MAX = 100
MAX_YAML_BYTES = 10 << 20


def name_problems(name: Any, field: str = "name") -> list[str]:
    """Problems of a run name (empty when it is safe)."""
    if not isinstance(name, str):
        return []  # the schema reports the type
    if len(name) > NAME_MAX:
        return [f"{field}: at most {NAME_MAX} characters (got {len(name)})"]
    if not NAME_RE.fullmatch(name):
        return [f"{field}: {ascii(name)} is not a safe run name: use letters, digits, '.', '_' "
                "and '-', starting with a letter or digit (it names the run directory)"]
    return []


def inside(root: Path, path: Path) -> bool:
    """Whether `path` resolves to a place inside `root` (symbolic links followed)."""
    try:
        path.resolve().relative_to(root.resolve())
        return True
    except ValueError:
        return False




def regular_file(path: Path, what: str) -> str | None:
    """None when `path` is a regular file (links followed); else why it cannot be read as one.
    A FIFO blocks the reader forever and /dev/zero never ends: neither is data."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return f"{what} not found: {path}"
    except OSError as exc:
        return f"{what}: {path}: {exc.strerror or exc}"
    if stat.S_ISDIR(st.st_mode):
        return f"{what}: {path} is a directory, not a file"
    if not stat.S_ISREG(st.st_mode):
        kind = "FIFO" if stat.S_ISFIFO(st.st_mode) else "device or socket"
        return f"{what}: {path} is a {kind}, not a regular file"
    return None


def special_file_problem(path: Path, what: str) -> str | None:
    """Why an existing path is neither a regular file nor a folder (a FIFO, a device, a
    socket); None otherwise, and for a missing path (its reader reports that)."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return None
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    kind = "FIFO" if stat.S_ISFIFO(mode) else "device or socket"
    return f"{what}: {path} is a {kind}, not a regular file"


def read_text(path: Path, what: str, max_bytes: int = MAX_YAML_BYTES) -> str:
    """A small regular text file; ValueError with the reason otherwise."""
    problem = regular_file(path, what)
    if problem:
        raise ValueError(problem)
    if path.stat().st_size > max_bytes:
        raise ValueError(f"{what}: {path} is larger than {max_bytes >> 20} MiB")
    with open(path, "rb") as f:
        data = f.read(max_bytes + 1)
    try:
        return data.decode()
    except UnicodeDecodeError:
        raise ValueError(f"{what}: {path} is not a UTF-8 text file") from None


def os_error_text(exc: OSError) -> str:
    """`[Errno 20] Not a directory: '/dev/null/x'` -> `/dev/null/x: not a directory`."""
    what = (exc.strerror or str(exc)).lower() if exc.strerror else str(exc)
    return f"{exc.filename}: {what}" if exc.filename is not None else what


def writable_dir_problem(out: Path, what: str = "--out") -> str | None:
    """Why run directories cannot be created under `out` (None when they can)."""
    p = out
    while not p.exists():
        if p.parent == p:
            break
        p = p.parent
    if not p.is_dir():
        return f"{what}: {p} is not a directory"
    if not os.access(p, os.W_OK | os.X_OK):
        return f"{what}: {p} is not writable"
    return None
