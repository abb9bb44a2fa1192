"""Paths and names that cannot hurt (raymm.io.paths): safe run names, paths inside a root,
regular files only, small UTF-8 text, writable output folders."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from raymm.io.paths import (
    NAME_MAX,
    inside,
    name_problems,
    os_error_text,
    read_text,
    regular_file,
    writable_dir_problem,
)


def test_run_names_are_letters_digits_dots_dashes_and_underscores() -> None:
    for good in ("tiny", "t1.b-c_d", "9"):
        assert name_problems(good) == []
    for bad in ("../up", ".hidden", "a b", "a/b", "", "é"):
        (problem,) = name_problems(bad, "run")
        assert problem.startswith("run: ") and "is not a safe run name" in problem
    (too_long,) = name_problems("a" * (NAME_MAX + 1))
    assert too_long == f"name: at most {NAME_MAX} characters (got {NAME_MAX + 1})"
    assert name_problems(3) == []                     # not text: the schema says so


def test_inside_follows_symbolic_links(tmp_path: Path) -> None:
    root = tmp_path / "out"
    (root / "run").mkdir(parents=True)
    assert inside(root, root / "run" / "x") and inside(root, root)
    assert not inside(root, root / ".." / "elsewhere")
    (root / "link").symlink_to(tmp_path)
    assert not inside(root, root / "link" / "x")


def test_only_a_regular_file_is_read(tmp_path: Path) -> None:
    ok = tmp_path / "s.yaml"
    ok.write_text("name: x\n")
    assert regular_file(ok, "scenario") is None and read_text(ok, "scenario") == "name: x\n"
    assert regular_file(tmp_path / "no.yaml", "scenario") == \
        f"scenario not found: {tmp_path / 'no.yaml'}"
    assert "is a directory" in regular_file(tmp_path, "scenario")
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    assert regular_file(fifo, "scenario") == f"scenario: {fifo} is a FIFO, not a regular file"
    big = tmp_path / "big.yaml"
    big.write_bytes(b"x" * 2048)
    with pytest.raises(ValueError, match="larger than 0 MiB"):
        read_text(big, "scenario", max_bytes=1024)
    binary = tmp_path / "b.yaml"
    binary.write_bytes(b"\xff\xfe")
    with pytest.raises(ValueError, match="not a UTF-8 text file"):
        read_text(binary, "scenario")


def test_an_output_folder_must_be_a_writable_directory(tmp_path: Path) -> None:
    assert writable_dir_problem(tmp_path / "new" / "deeper") is None   # created on demand
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert writable_dir_problem(blocker / "runs") == f"--out: {blocker} is not a directory"
    try:
        open("/dev/null/x")
    except OSError as exc:
        assert os_error_text(exc) == "/dev/null/x: not a directory"
