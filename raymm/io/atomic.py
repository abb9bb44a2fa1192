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


@contextmanager
def atomic_output(dest: Path) -> Iterator[BinaryIO]:
    """Yields a binary file open on a hidden `.part` temp file beside `dest`; when the block
    ends normally the file is flushed to disk and renamed over `dest`. Any exception in the
    block (raise one to reject what was written) deletes the temp file, and `dest` is left as
    it was."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=PART_SUFFIX, dir=dest.parent)
    try:
        # mkstemp makes the file 0600; a run's files get the mode any new file would (0644
        # under the usual umask), like TensorBoard's events file beside them
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
