"""Pulling a cluster run's files (`actors.remote_run.write_changes`), cut short."""

from __future__ import annotations

from contextlib import contextmanager

import pytest

from actors import remote_run
from raymm.io.atomic import atomic_output


def test_a_pull_cut_short_never_leaves_files_without_the_config(tmp_path, monkeypatch) -> None:
    """The changes come in path order (`checkpoints/` before `config.yaml`); killed after its
    first write, a pull must already have written config.yaml, or the next sweep refuses the
    folder as not a run directory."""
    written = []

    @contextmanager
    def dies_on_the_second(dest):
        if written:
            raise KeyboardInterrupt   # the process killed mid-pull
        written.append(dest.name)
        with atomic_output(dest) as f:
            yield f

    monkeypatch.setattr(remote_run, "atomic_output", dies_on_the_second)
    changes = {"checkpoints/round_00003.safetensors": b"ckpt", "config.yaml": b"name: x\n",
               "rounds.parquet": b"rows", "old.txt": None}
    with pytest.raises(KeyboardInterrupt):
        remote_run.write_changes(tmp_path, changes)
    assert written == ["config.yaml"]
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["config.yaml"]


def test_a_whole_pull_writes_every_file_and_removes_the_gone(tmp_path) -> None:
    (tmp_path / "old.txt").write_text("gone on the node")
    remote_run.write_changes(tmp_path, {"checkpoints/c": b"1", "config.yaml": b"2",
                                        "old.txt": None})
    assert (tmp_path / "checkpoints" / "c").read_bytes() == b"1"
    assert (tmp_path / "config.yaml").read_bytes() == b"2"
    assert not (tmp_path / "old.txt").exists()
