"""Writing a file all at once (raymm.io.atomic): the file appears whole or not at all, an
exception leaves the old file and no temp file, and a killed write's leftover is recognised."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from raymm.io.atomic import PART_SUFFIX, atomic_output, is_leftover, staging_file


def test_the_file_appears_only_when_the_block_ends(tmp_path: Path) -> None:
    dest = tmp_path / "sub" / "out.bin"
    with atomic_output(dest) as f:
        f.write(b"hello")
        assert not dest.exists()                   # nothing under the real name yet
        [tmp] = list(dest.parent.iterdir())
        assert is_leftover(tmp) and tmp.name.startswith(".out.bin.")
    assert dest.read_bytes() == b"hello"
    assert list(dest.parent.iterdir()) == [dest]


def test_an_exception_keeps_the_old_file_and_removes_the_temp_file(tmp_path: Path) -> None:
    dest = tmp_path / "out.bin"
    dest.write_bytes(b"old")
    with pytest.raises(ValueError, match="rejected"):
        with atomic_output(dest) as f:
            f.write(b"half of the new")
            raise ValueError("rejected")
    assert dest.read_bytes() == b"old"
    assert list(tmp_path.iterdir()) == [dest]


def test_a_staging_file_has_the_mode_of_a_new_file(tmp_path: Path) -> None:
    tmp = staging_file(tmp_path / "x.json")
    mask = os.umask(0o22)
    os.umask(mask)
    assert tmp.name.endswith(PART_SUFFIX) and tmp.stat().st_size == 0
    assert tmp.stat().st_mode & 0o777 == 0o666 & ~mask
    assert not is_leftover(tmp_path / "x.json") and not is_leftover(tmp_path / "x.part")
