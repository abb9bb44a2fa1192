"""The `uci-har` converter (raymm.data.releases.uci_har) on tiny releases in the official
layout: a folder, the official zip and the nested download; bad inputs fail cleanly and write
nothing."""

import zipfile

import numpy as np
import pytest

from raymm.app.cli import main
from raymm.data import load_dataset
from raymm.data.prepare import prepare
from raymm.errors import DataError

from tiny_releases import npz, uci_har_folder


def _zip_folder(top, zpath, extra_macosx=True):
    with zipfile.ZipFile(zpath, "w") as zf:
        for p in sorted(top.rglob("*")):
            if p.is_file():
                zf.write(p, f"{top.name}/{p.relative_to(top).as_posix()}")
        if extra_macosx:
            zf.writestr("__MACOSX/UCI HAR Dataset/._train", b"junk")
    return zpath


def test_uci_har_folder_to_the_har_npz_layout(tmp_path):
    top = uci_har_folder(tmp_path / "rel")
    out = tmp_path / "out" / "har.npz"
    res = prepare("uci-har", top.parent, out)  # the parent of 'UCI HAR Dataset' works too
    z = npz(out)
    assert res.sizes == {"train": 3, "test": 2} and res.path == out
    assert z["train_acc"].shape == (3, 128, 3) and z["test_gyro"].shape == (2, 128, 3)
    # acc = total_acc (code 0), gyro = body_gyro (code 1); axis k adds k, window i adds i
    assert z["train_acc"][2, 5, 1] == pytest.approx(0 + 1 + 2 + 0.005)
    assert z["test_gyro"][1, 127, 2] == pytest.approx(10 + 2 + 1 + 0.127)
    assert z["train_y"].tolist() == [5, 4, 3] and z["test_y"].tolist() == [5, 4]
    assert z["train_subject"].tolist() == [1, 2, 3]
    assert z["class_names"].tolist() == ["WALK", "UP", "DOWN", "SIT", "STAND", "LAY"]
    assert float(z["sample_rate_hz"]) == 50.0
    ds = load_dataset("har", {"path": str(out), "standardize": False}, 0)
    ref = load_dataset("har", {"path": str(top), "standardize": False}, 0)
    for a, b in ((ds.train, ref.train), (ds.test, ref.test)):
        assert np.array_equal(a.x["acc"], b.x["acc"]) and np.array_equal(a.x["gyro"], b.x["gyro"])
        assert np.array_equal(a.y, b.y) and np.array_equal(a.group, b.group)
    assert ds.class_names == ("WALK", "UP", "DOWN", "SIT", "STAND", "LAY")
    assert load_dataset("har", {"path": str(out)}, 0).train.x["acc"].shape == (3, 128, 3)


def test_uci_har_official_zip_and_the_nested_uci_download(tmp_path, monkeypatch):
    top = uci_har_folder(tmp_path / "rel")
    monkeypatch.setenv("RAYMM_DATA", str(tmp_path / "data"))
    ref = npz(prepare("uci-har", top, tmp_path / "ref.npz").path)
    inner = _zip_folder(top, tmp_path / "UCI HAR Dataset.zip")
    outer = tmp_path / "human+activity+recognition+using+smartphones.zip"
    with zipfile.ZipFile(outer, "w") as zf:  # what the UCI site serves: a zip in a zip
        zf.write(inner, "UCI HAR Dataset.zip")
        zf.writestr("UCI HAR Dataset.names", "names")
    for src in (inner, outer):
        res = prepare("uci-har", src, force=True)  # default output: $RAYMM_DATA/uci_har.npz
        assert res.path == tmp_path / "data" / "uci_har.npz"
        got = npz(res.path)
        for k in ("train_acc", "test_gyro", "train_y", "test_subject", "class_names"):
            assert np.array_equal(got[k], ref[k]), k
    assert load_dataset("har", {"path": "uci_har.npz"}, 0).test.y.tolist() == [5, 4]


def test_uci_har_bad_inputs_fail_cleanly_and_write_nothing(tmp_path, capsys):
    top = uci_har_folder(tmp_path / "rel")
    (top / "test" / "Inertial Signals" / "body_gyro_y_test.txt").unlink()
    broken = _zip_folder(top, tmp_path / "broken.zip")
    out = tmp_path / "out"
    argv = ["data", "prepare", "uci-har", "--from", str(broken), "--out", str(out / "a.npz")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "member 'UCI HAR Dataset/test/Inertial Signals/body_gyro_y_test.txt' missing" in err
    assert err.count("\n") == 1 and "Traceback" not in err
    with pytest.raises(DataError, match=r"'test/Inertial Signals/body_gyro_y_test.txt' missing"):
        prepare("uci-har", top, out / "b.npz")
    with pytest.raises(DataError, match="not a UCI-HAR folder"):
        prepare("uci-har", tmp_path, out / "c.npz")
    (tmp_path / "junk.zip").write_bytes(b"PK\x03\x04 not really")
    with pytest.raises(DataError, match="unreadable zip"):
        prepare("uci-har", tmp_path / "junk.zip", out / "d.npz")
    with pytest.raises(DataError, match="--from path not found"):
        prepare("uci-har", tmp_path / "nope", out / "e.npz")
    assert not out.exists() or not list(out.iterdir())
