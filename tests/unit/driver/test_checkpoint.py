"""Checkpoints (raymm.driver.checkpoint): a checkpoint file comes back as written, only the
newest `keep` stay, a run resumes from the newest one that verifies (naming the ones that do
not), and the scenario's identity leaves out where and how it runs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from raymm.driver import checkpoint
from raymm.driver.checkpoint import Checkpoint
from raymm.errors import ResumeError
from raymm.io.statefile import StateFormatError


def _ckpt(round: int) -> Checkpoint:
    return Checkpoint(round, "d" * 64, {"params": {"g": np.arange(3, dtype=np.float32)}},
                      {4: {"params/g": np.ones(2, np.float32)}}, [{"round": round}], 1.5,
                      {round: np.array([4, 7])})


def test_a_checkpoint_comes_back_as_written_and_only_the_newest_stay(tmp_path: Path) -> None:
    for t in (1, 2, 3):
        path = checkpoint.save(tmp_path, _ckpt(t), keep=2)
        assert path == checkpoint.path_of(tmp_path, t) == \
            tmp_path / "checkpoints" / f"round-{t:06d}.safetensors"
    assert [t for t, _ in checkpoint.candidates(tmp_path)] == [3, 2]
    assert checkpoint.latest(tmp_path) == checkpoint.path_of(tmp_path, 3)
    back = checkpoint.read(checkpoint.path_of(tmp_path, 3))
    assert (back.round, back.scenario_digest, back.rows, back.wall_seconds) == \
        (3, "d" * 64, [{"round": 3}], 1.5)
    assert np.array_equal(back.server["params"]["g"], [0, 1, 2])
    assert np.array_equal(back.hosts[4]["params/g"], [1, 1])
    assert back.selected[3].tolist() == [4, 7]
    with pytest.raises(StateFormatError, match="not a regular file"):
        checkpoint.read(tmp_path / "checkpoints")


def test_resume_takes_the_newest_checkpoint_that_verifies(tmp_path: Path) -> None:
    with pytest.raises(ResumeError, match="no config.yaml"):
        checkpoint.load(tmp_path)
    (tmp_path / "config.yaml").write_text("name: x\n")
    with pytest.raises(ResumeError, match="has no checkpoint to resume from"):
        checkpoint.load(tmp_path)
    checkpoint.save(tmp_path, _ckpt(1))
    checkpoint.path_of(tmp_path, 2).write_bytes(b"damaged")
    said: list[str] = []
    assert checkpoint.load(tmp_path, said.append).round == 1
    assert len(said) == 1 and said[0].startswith("skipped checkpoint(s) that do not verify: "
                                                 "round-000002.safetensors")
    checkpoint.path_of(tmp_path, 1).write_bytes(b"damaged too")
    with pytest.raises(ResumeError, match="no checkpoint in .* verifies"):
        checkpoint.load(tmp_path)


def test_the_scenarios_identity_leaves_out_where_and_how_it_runs() -> None:
    config = {"name": "x", "seed": 1, "training": {"lr": 0.1},
              "execution": {"executor": "serial"}, "output": {"tensorboard": False}}
    elsewhere = {**config, "execution": {"executor": "ray"}, "output": {"tensorboard": True}}
    digest = checkpoint.scenario_digest(config)
    assert checkpoint.scenario_digest(elsewhere) == digest and checkpoint.is_of(elsewhere, digest)
    assert not checkpoint.is_of({**config, "seed": 2}, digest)
