"""The `hapt` converter (raymm.data.releases.hapt): HAPT's raw signals to the HAR file, on a
tiny release written in the official layout (a folder, a zip of it, CRLF files), with the
expected windows worked out here by hand; the HAR loader reads the result; layout errors are
one message and write nothing."""

from __future__ import annotations

import numpy as np
import pytest

from raymm.app.cli import main
from raymm.data import load_dataset
from raymm.data.prepare import prepare
from raymm.data.releases import SOURCES
from raymm.errors import DataError

from tiny_releases import HAPT_EXPERIMENTS, hapt_raw, hapt_signal, nothing_written, npz, zip_tree

#: the windows of the tiny release (tiny_releases.HAPT_LABELS), by hand: (experiment, start, y)
#: train: user 1 (exp 1): activity 5 at 1..128 -> one window at 0; activity 1 at 201..455 ->
#: 200 and 264 (328 + 128 > 455); activity 4 at 456..582 (127 samples) -> none; user 3 (exp 3):
#: activity 6 at 10..200 -> 9. test: user 2 (exp 2): activity 2 at 5..260 -> 4, 68, 132;
#: activity 3 at 261..400 -> 260.
HAPT_TRAIN = [(1, 0, 4), (1, 200, 0), (1, 264, 0), (3, 9, 5)]
HAPT_TEST = [(2, 4, 1), (2, 68, 1), (2, 132, 1), (2, 260, 2)]
HAPT_KEYS = [f"{sp}_{k}" for sp in ("train", "test")
             for k in ("acc", "gyro", "y", "subject", "exp", "start")] + ["class_names",
                                                                            "sample_rate_hz"]


def _check_tiny_hapt(z: dict[str, np.ndarray]) -> None:
    assert list(z) == HAPT_KEYS
    for sp, rows in (("train", HAPT_TRAIN), ("test", HAPT_TEST)):
        for m in ("acc", "gyro"):
            want = np.stack([hapt_signal(e, m, HAPT_EXPERIMENTS[e][1])[k:k + 128]
                             for e, k, _ in rows]).astype(np.float32)
            assert z[f"{sp}_{m}"].dtype == np.float32 and z[f"{sp}_{m}"].shape == want.shape
            np.testing.assert_array_equal(z[f"{sp}_{m}"], want)
        for key, col in (("exp", 0), ("start", 1), ("y", 2)):
            assert z[f"{sp}_{key}"].dtype == np.int64
            assert z[f"{sp}_{key}"].tolist() == [r[col] for r in rows]
        assert z[f"{sp}_subject"].tolist() == [HAPT_EXPERIMENTS[e][0] for e, _, _ in rows]
    assert z["class_names"].dtype == np.dtype("<U18")
    assert z["class_names"].tolist()[2] == "WALKING_DOWNSTAIRS"
    assert z["sample_rate_hz"].dtype == np.int64 and z["sample_rate_hz"].shape == ()
    assert int(z["sample_rate_hz"]) == 50


def test_hapt_windows_from_the_raw_folder_a_zip_and_crlf_files(tmp_path):
    raw = hapt_raw(tmp_path / "HAPT" / "RawData")
    res = prepare("hapt", tmp_path / "HAPT", tmp_path / "a.npz")  # a folder above RawData
    _check_tiny_hapt(npz(res.path))
    assert res.sizes == {"train": 4, "test": 4} and res.shapes == {"acc": (128, 3),
                                                                 "gyro": (128, 3)}
    # a tiny release is not the reference one: every data array is named as differing
    assert res.differs and "train_acc" in res.differs and "class_names" not in res.differs
    zpath = zip_tree(raw, tmp_path / "uci.zip", top="RawData/")  # UCI's zip: RawData/ inside
    _check_tiny_hapt(npz(prepare("hapt", zpath, tmp_path / "b.npz").path))
    crlf = hapt_raw(tmp_path / "crlf", crlf=True)
    _check_tiny_hapt(npz(prepare("hapt", crlf, tmp_path / "c.npz").path))


def test_the_prepared_hapt_file_is_what_the_har_loader_reads(tmp_path, monkeypatch, capsys):
    data = tmp_path / "data"
    data.mkdir()
    monkeypatch.setenv("RAYMM_DATA", str(data))
    # where `raymm data download hapt` puts UCI's zip; `prepare hapt` needs no --from then
    zip_tree(hapt_raw(tmp_path / "raw"), SOURCES["hapt"].release_path(data), top="RawData/")
    assert main(["data", "prepare", "hapt", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert f"prepared hapt: {data / 'uci_har_hapt_raw_windows.npz'} (train 4, test 4;" in out
    assert "reference: differs from the file the shipped results were made with in" in out
    ds = load_dataset("har", {"standardize": False}, 0)  # the loader's default file
    assert ds.train.y.tolist() == [4, 0, 0, 5] and ds.test.group.tolist() == [2, 2, 2, 2]


def test_hapt_layout_errors_are_one_message_and_write_nothing(tmp_path):
    out = tmp_path / "out"
    out.mkdir()

    def fails(src, match):
        with pytest.raises(DataError, match=match):
            prepare("hapt", src, out / "h.npz")
        assert nothing_written(out)

    raw = hapt_raw(tmp_path / "raw")
    (raw / "gyro_exp02_user02.txt").unlink()
    fails(raw, r"acc_exp02_user02.txt has no gyro_exp02_user02.txt beside it")
    raw = hapt_raw(tmp_path / "raw2")
    (raw / "labels.txt").write_text("1 1 5 1 128\n2 2 2 300 500\n")  # exp 2 has 400 samples
    fails(raw, r"raw2/labels.txt: segment 300..500 of experiment 2 lies outside its 400 samples")
    (raw / "labels.txt").write_text("1 1 5 1\n")
    fails(raw, r"labels.txt: expected rows of 5 numbers, got shape \(1, 4\)")
    (raw / "labels.txt").write_text("1 1 5 1 128\n")  # user 1 only: no test subject
    fails(raw, r"no test window \(test subjects are \[2, 4, 9")
    (raw / "labels.txt").write_text("1 2 5 1 128\n")
    fails(raw, r"experiment 1 is user 2, but its recording is named for user 1")
    (raw / "labels.txt").write_text("4 4 1 1 200\n")
    fails(raw, r"experiment 4 has no acc_exp04_user04.txt")
    (raw / "labels.txt").unlink()
    fails(raw, r"no labels.txt beside the raw signals")
    raw = hapt_raw(tmp_path / "raw3")
    (raw / "acc_exp01_user01.txt").write_text("1 2 3\n4 x 6\n")
    fails(raw, r"acc_exp01_user01.txt: unreadable")
    (raw / "acc_exp01_user01.txt").write_text("1 2 3\n4 5 6\n")
    fails(raw, r"acc_exp01_user01.txt has 2 samples but gyro_exp01_user01.txt has 700")
    empty = tmp_path / "empty"
    empty.mkdir()
    fails(empty, r"no hapt files in it \(expected the HAPT raw release")
    twice = tmp_path / "twice"
    hapt_raw(twice / "a")
    hapt_raw(twice / "b")
    fails(twice, r"hapt files in more than one folder .*pass the one to read with --from")
    (tmp_path / "bad.zip").write_bytes(b"PK\x03\x04 not really")
    fails(tmp_path / "bad.zip", r"bad.zip: unreadable zip")
