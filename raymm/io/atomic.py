"""Writing a file all at once, so a crash or a bad input never leaves it half-written."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO


def _umask() -> int:
    mask = os.umask(0o22)  # the only way to read it is to set it
    os.umask(mask)
    return mask


#: what an `atomic_output` writes to before its rename: `.<name>.<random><PART_SUFFIX>`
PART_SUFFIX = ".part"


def is_leftover(path: Path) -> bool:
    """Whether `path` is the hidden temp file of an `atomic_output` whose process was killed
    before the rename (what a SIGKILL mid-write leaves; nothing reads it)."""
    return path.name.startswith(".") and path.name.endswith(PART_SUFFIX)


def staging_file(dest: Path) -> Path:
    """A new, empty hidden `.part` temp file beside `dest` (the same folder: renaming it over
    `dest` is atomic), with the mode any new file gets: mkstemp makes it 0600, a run's files
    and downloads get 0644 under the usual umask, like TensorBoard's events file beside them."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=PART_SUFFIX, dir=dest.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())
    finally:
        os.close(fd)
    return Path(tmp)


@contextmanager
def atomic_output(dest: Path) -> Iterator[BinaryIO]:
    """Yields a binary file open on a hidden `.part` temp file beside `dest`; when the block
    ends normally the file is flushed to disk and renamed over `dest`. Any exception in the
    block (raise one to reject what was written) deletes the temp file, and `dest` is left as
    it was."""
    tmp = staging_file(dest)
    try:
        with open(tmp, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
