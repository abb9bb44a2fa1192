"""Writing a file all at once, so a crash or a bad input never leaves it half-written."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO


@contextmanager
def atomic_output(dest: Path) -> Iterator[BinaryIO]:
    """Yields a binary file open on a hidden `.part` temp file beside `dest`; when the block
    ends normally the file is flushed to disk and renamed over `dest`. Any exception in the
    block (raise one to reject what was written) deletes the temp file, and `dest` is left as
    it was."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".part", dir=dest.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
