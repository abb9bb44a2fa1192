"""Checkpoints are data: a planted payload never runs, a damaged newest checkpoint falls back to
an older one that verifies (and says so), old pickles are refused with a message."""

import pickle
import shutil

import numpy as np
import pytest

from raymm.app.api import run
from raymm.app.cli import main
from raymm.driver import checkpoint
from raymm.io import statefile

from helpers import Payload, tiny_scenario


def assert_same_run(a_dir, a_params, b_dir, b_params):
    import pandas as pd

    for g in a_params:
        assert np.array_equal(a_params[g], b_params[g]), g
    cols = ["wall_seconds"]
    pd.testing.assert_frame_equal(pd.read_parquet(a_dir / "rounds.parquet").drop(columns=cols),
                                  pd.read_parquet(b_dir / "rounds.parquet").drop(columns=cols),
                                  check_exact=True)


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A 7-round run with checkpoints at rounds 3 and 6 (and per-device adapters)."""
    raw = tiny_scenario(**{"rounds": 7, "output.checkpoint_every": 3, "model.adapter": True,
                           "objective": {"name": "ce", "adapter": True}})
    return run(raw, out=tmp_path_factory.mktemp("ref"))


def fresh_copy(finished, tmp_path):
    run_dir = tmp_path / "copy"
    shutil.copytree(finished.run_dir, run_dir)
    return run_dir


def test_planted_payloads_never_run(finished, tmp_path, capsys):
    run_dir = fresh_copy(finished, tmp_path)
    marker = tmp_path / "payload-ran"
    blob = pickle.dumps({"round": 99, "server": Payload(marker)})
    ckpts = run_dir / "checkpoints"
    # a pickle under the new name is newer than every real checkpoint: skipped, said so
    (ckpts / "round-000099.safetensors").write_bytes(blob)
    (ckpts / "round-000098.pkl").write_bytes(blob)
    assert main(["run", "--resume", str(run_dir), "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert "skipped checkpoint(s) that do not verify: round-000099.safetensors" in err
    assert "resuming from round-000006.safetensors (round 6)" in err
    assert not marker.exists()
    # only the old pickle left: refused with a message, never loaded
    for p in ckpts.glob("*.safetensors"):
        p.unlink()
    assert main(["run", "--resume", str(run_dir), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "pickled checkpoint(s) of raymm 0.1" in err and "can run code" in err
    assert not marker.exists()


def test_damaged_newest_falls_back_to_the_newest_that_verifies(finished, tmp_path, capsys):
    run_dir = fresh_copy(finished, tmp_path)
    newest = run_dir / "checkpoints" / "round-000006.safetensors"
    data = bytearray(newest.read_bytes())
    data[-5] ^= 0x40  # one flipped bit in the tensor data
    newest.write_bytes(bytes(data))
    res = run(resume=run_dir)
    err = capsys.readouterr().err
    assert "round-000006.safetensors: checksum mismatch" in err
    assert "resuming from round-000003.safetensors (round 3)" in err
    assert_same_run(finished.run_dir, finished.params, res.run_dir, res.params)


def test_content_that_verifies_but_does_not_fit_is_exit_2(finished, tmp_path, capsys):
    run_dir = fresh_copy(finished, tmp_path)
    ck = checkpoint.load(run_dir)
    bad = checkpoint.Checkpoint(ck.round, ck.scenario_digest, {"params": "not arrays"},
                                ck.hosts, ck.rows, ck.wall_seconds, ck.selected)
    checkpoint.save(run_dir, bad)
    assert main(["run", "--resume", str(run_dir), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "does not fit this scenario's state" in err and "Traceback" not in err
    # a future format version is named as such
    path = checkpoint.path_of(run_dir, ck.round)
    from safetensors.numpy import load, save

    meta = statefile._metadata(path.read_bytes())
    path.write_bytes(save(load(path.read_bytes()), metadata={**meta, "version": "7"}))
    with pytest.raises(statefile.StateFormatError, match="format version '7'"):
        checkpoint.read(path)


def test_checkpoint_keeps_device_state_and_rows_exactly(finished):
    ck = checkpoint.load(finished.run_dir)
    assert ck.round == 6 and len(ck.rows) == 6 and ck.hosts
    assert all(isinstance(k, int) for k in ck.hosts) and all(isinstance(k, int)
                                                           for k in ck.selected)
    assert isinstance(next(iter(ck.hosts.values())), np.ndarray)
    files = sorted(p.name for p in (finished.run_dir / "checkpoints").iterdir())
    assert files == ["round-000003.safetensors", "round-000006.safetensors"]
