"""`raymm data prepare` for the public releases the shipped scenarios read: HAPT -> the HAR file,
FSDD and MNIST -> the audio-visual digits files.

Always: each converter on a tiny release written in the official layout (a folder, a zip of it,
GitHub's zip with its top folder), with the expected arrays worked out here by hand.
With the real releases (RAYMM_RELEASE_HAPT, RAYMM_RELEASE_FSDD, RAYMM_RELEASE_MNIST): the output
is compared with the reference files array by array (dtype and shape included), against the
pinned digests and, where RAYMM_DATA holds them, against the files themselves.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from raymm.app.cli import main
from raymm.data import load_dataset
from raymm.data.prepare import array_sha256, prepare
from raymm.data.releases import REFERENCE, SOURCES
from raymm.errors import DataError, RaymmError

from tiny_releases import (
    FSDD_CLIPS,
    HAPT_EXPERIMENTS,
    fsdd_release,
    fsdd_wave,
    hapt_raw,
    hapt_signal,
    idx_bytes,
    mnist_arrays,
    mnist_release,
    pcm_wav,
    zip_tree,
)


def _npz(path: Path) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def _nothing_written(folder: Path) -> bool:
    return not [p for p in folder.iterdir() if p.suffix in (".npz", ".part")
                or p.name.endswith(".part")]


# --------------------------------------------------------------------------- HAPT

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
    _check_tiny_hapt(_npz(res.path))
    assert res.sizes == {"train": 4, "test": 4} and res.shapes == {"acc": (128, 3),
                                                                 "gyro": (128, 3)}
    # a tiny release is not the reference one: every data array is named as differing
    assert res.differs and "train_acc" in res.differs and "class_names" not in res.differs
    zpath = zip_tree(raw, tmp_path / "uci.zip", top="RawData/")  # UCI's zip: RawData/ inside
    _check_tiny_hapt(_npz(prepare("hapt", zpath, tmp_path / "b.npz").path))
    crlf = hapt_raw(tmp_path / "crlf", crlf=True)
    _check_tiny_hapt(_npz(prepare("hapt", crlf, tmp_path / "c.npz").path))


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
        assert _nothing_written(out)

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


def test_prepare_without_from_says_how_to_get_the_release(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("RAYMM_DATA", str(tmp_path))
    assert main(["data", "prepare", "hapt", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "hapt_dataset.zip not found; fetch it with `raymm data download hapt`" in err
    assert err.count("\n") == 1
    with pytest.raises(RaymmError, match=r"--from is required \(crema-d has no download"):
        prepare("crema-d")


# --------------------------------------------------------------------------- FSDD

def _check_tiny_fsdd(z: dict[str, np.ndarray]) -> None:
    assert list(z) == ["audio", "label", "speaker", "speaker_names", "index", "orig_length",
                       "sample_rate"]
    rows = sorted(FSDD_CLIPS, key=lambda c: (c[1], c[0], c[2]))  # speaker, digit, take
    names = sorted({c[1] for c in FSDD_CLIPS})
    assert z["speaker_names"].tolist() == names == ["george", "theo", "yweweler"]
    assert z["speaker_names"].dtype == np.dtype("<U8")
    assert z["audio"].dtype == np.int16 and z["audio"].shape == (len(rows), 8000)
    for i, (digit, speaker, take, n) in enumerate(rows):
        w = fsdd_wave(digit, speaker, take, n)[:8000]
        np.testing.assert_array_equal(z["audio"][i, :w.shape[0]], w)
        assert not z["audio"][i, w.shape[0]:].any()  # zero-padded at the end
    for key in ("label", "speaker", "index", "orig_length"):
        assert z[key].dtype == np.int64
    assert z["label"].tolist() == [0, 0, 7, 0, 1, 1]
    assert z["speaker"].tolist() == [0, 0, 0, 1, 1, 2]
    assert z["index"].tolist() == [0, 1, 12, 0, 0, 3]
    assert z["orig_length"].tolist() == [5000, 4000, 8000, 3000, 9000, 100]
    assert z["sample_rate"].dtype == np.int64 and int(z["sample_rate"]) == 8000


def test_fsdd_from_the_repository_its_recordings_folder_and_githubs_zip(tmp_path):
    repo = fsdd_release(tmp_path / "free-spoken-digit-dataset")
    res = prepare("fsdd", repo, tmp_path / "a.npz")
    _check_tiny_fsdd(_npz(res.path))
    assert res.sizes == {"recordings": 6} and res.shapes == {"audio": (8000,)}
    _check_tiny_fsdd(_npz(prepare("fsdd", repo / "recordings", tmp_path / "b.npz").path))
    zpath = zip_tree(repo, tmp_path / "gh.zip", top=f"free-spoken-digit-dataset-{'0' * 40}/")
    _check_tiny_fsdd(_npz(prepare("fsdd", zpath, tmp_path / "c.npz").path))


@pytest.mark.parametrize("kind, match", [
    ("stereo", r"expected mono 16-bit PCM at 8000 Hz, got 2 channel\(s\), 16-bit, 8000 Hz"),
    ("16k", r"got 1 channel\(s\), 16-bit, 16000 Hz"),
    ("8bit", r"got 1 channel\(s\), 8-bit, 8000 Hz"),
    ("junk", r"3_theo_9.wav: unreadable wav"),
    ("empty", r"3_theo_9.wav: no samples"),
])
def test_fsdd_refuses_what_is_not_its_format(tmp_path, kind, match):
    repo = fsdd_release(tmp_path / "fsdd")
    bad = repo / "recordings" / "3_theo_9.wav"
    if kind == "junk":
        bad.write_bytes(b"RIFF....WAVEfmt nonsense")
    else:
        pcm_wav(bad, np.zeros(0 if kind == "empty" else 100, np.int16),
                rate=16000 if kind == "16k" else 8000, channels=2 if kind == "stereo" else 1,
                width=1 if kind == "8bit" else 2)
    with pytest.raises(DataError, match=match):
        prepare("fsdd", repo, tmp_path / "f.npz")
    assert not (tmp_path / "f.npz").exists()


# --------------------------------------------------------------------------- MNIST

@pytest.mark.parametrize("gz", [True, False])
def test_mnist_test_and_train_splits_from_the_idx_files(tmp_path, gz):
    folder = mnist_release(tmp_path / "MNIST" / "raw", gz=gz)
    for name, split, n, seed in (("mnist", "test", 30, 2), ("mnist-train", "train", 12, 1)):
        res = prepare(name, tmp_path / "MNIST", tmp_path / f"{split}.npz")
        z = _npz(res.path)
        x, y = mnist_arrays(n, seed)
        assert list(z) == ["x", "y"] and z["x"].dtype == np.uint8 and z["y"].dtype == np.int64
        np.testing.assert_array_equal(z["x"], x)
        np.testing.assert_array_equal(z["y"], y.astype(np.int64))
        assert res.sizes == {"images": n} and res.shapes == {"visual": (28, 28)}
    zpath = zip_tree(folder, tmp_path / "mnist.zip", top="raw/")
    np.testing.assert_array_equal(_npz(prepare("mnist", zpath, tmp_path / "z.npz").path)["x"],
                                  mnist_arrays(30, 2)[0])


def test_mnist_idx_problems_are_named(tmp_path):
    folder = mnist_release(tmp_path / "m", gz=False)
    out = tmp_path / "o.npz"
    labels = folder / "t10k-labels-idx1-ubyte"
    good = labels.read_bytes()
    labels.write_bytes(good[:-1])
    with pytest.raises(DataError, match=r"t10k-labels-idx1-ubyte: idx header says \(30,\) "
                                        r"\(30 bytes\) but 29 bytes follow"):
        prepare("mnist", folder, out)
    labels.write_bytes(b"\x00\x00\x0d\x01" + good[4:])
    with pytest.raises(DataError, match=r"not an unsigned-byte idx file \(magic 00000d01\)"):
        prepare("mnist", folder, out)
    labels.write_bytes(idx_bytes(np.full(30, 10, np.uint8)))
    with pytest.raises(DataError, match=r"labels must be digits 0..9, found 10"):
        prepare("mnist", folder, out)
    labels.write_bytes(idx_bytes(np.zeros(29, np.uint8)))
    with pytest.raises(DataError, match=r"do not pair up"):
        prepare("mnist", folder, out)
    labels.unlink()
    with pytest.raises(DataError, match=r"no t10k-labels-idx1-ubyte.gz \(or t10k-labels"):
        prepare("mnist", folder, out)
    (folder / "t10k-labels-idx1-ubyte.gz").write_bytes(b"\x1f\x8b not gzip")
    with pytest.raises(DataError, match=r"unreadable gzip"):
        prepare("mnist", folder, out)
    assert not out.exists()


def test_prepared_fsdd_and_mnist_are_what_avdigits_reads(tmp_path, monkeypatch):
    monkeypatch.setenv("RAYMM_DATA", str(tmp_path))
    prepare("fsdd", fsdd_release(tmp_path / "fsdd"))
    prepare("mnist", mnist_release(tmp_path / "mnist"))
    ds = load_dataset("avdigits", {}, seed=0)  # the default files: fsdd_audio_8k, mnist_test
    assert ds.train.y.shape[0] + ds.test.y.shape[0] == len(FSDD_CLIPS)
    assert ds.test.y.tolist() == [0, 0, 0, 1, 1]  # takes < 5, rows by speaker, digit, take


# --------------------------------------------------------------------------- the real releases

RELEASES = {
    "hapt": ("RAYMM_RELEASE_HAPT", "uci_har_hapt_raw_windows.npz",
             "the HAPT raw release (its RawData folder, or UCI's zip: `raymm data download "
             "hapt` puts it at $RAYMM_DATA/hapt_dataset.zip)"),
    "fsdd": ("RAYMM_RELEASE_FSDD", "fsdd_audio_8k.npz",
             "the FSDD recordings/ folder or the repository's zip (`raymm data download fsdd`)"),
    "mnist": ("RAYMM_RELEASE_MNIST", "mnist_test_28x28.npz",
              "a folder with MNIST's four idx files (`raymm data download mnist`)"),
}


def _release(name: str) -> Path:
    var, _, what = RELEASES[name]
    root = os.environ.get(var)
    if not root:
        pytest.skip(f"{var} is not set; point it at {what} to compare with the reference "
                    f"file bit for bit")
    path = Path(root)
    assert path.exists(), f"{var}={root} does not exist"
    return path


def _reference_file(filename: str) -> Path | None:
    root = os.environ.get("RAYMM_DATA")
    path = Path(root) / filename if root else None
    return path if path is not None and path.is_file() else None


def _assert_identical(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert list(got) == list(want)
    for k in want:
        assert got[k].dtype == want[k].dtype, k
        assert got[k].shape == want[k].shape, k
        assert np.array_equal(got[k], want[k]), k


@pytest.mark.parametrize("name", sorted(RELEASES))
def test_the_real_release_reproduces_the_reference_file_bit_for_bit(name, tmp_path):
    src = _release(name)
    filename = RELEASES[name][1]
    res = prepare(name, src, tmp_path / filename, progress=False)
    got = _npz(res.path)
    assert res.differs == ()
    assert {k: array_sha256(a) for k, a in got.items()} == REFERENCE[name]
    ref = _reference_file(filename)
    if ref is not None:  # RAYMM_DATA holds the file itself: every array, dtype and shape
        _assert_identical(got, _npz(ref))


def test_real_mnist_training_images_against_the_reconstruction(tmp_path):
    """The exact training images; `mnist_train_28x28_recon.npz` (RAYMM_DATA) is within 1 grey
    level of them (measured: 97.24% of pixels equal, 3255 of 60000 images exact)."""
    src = _release("mnist")
    res = prepare("mnist-train", src, tmp_path / "train.npz")
    assert res.differs == () and res.sizes == {"images": 60000}
    recon = _reference_file("mnist_train_28x28_recon.npz")
    if recon is None:
        pytest.skip("RAYMM_DATA holds no mnist_train_28x28_recon.npz to compare with")
    exact, approx = _npz(res.path), _npz(recon)
    assert np.array_equal(exact["y"], approx["y"])
    diff = np.abs(exact["x"].astype(np.int16) - approx["x"].astype(np.int16))
    assert diff.max() == 1 and (diff == 0).mean() > 0.97


def test_the_pinned_digests_are_those_of_the_reference_files(data_dir):
    """REFERENCE pins the very files in RAYMM_DATA (the ones the shipped results used)."""
    for name, (_, filename, _) in RELEASES.items():
        z = _npz(data_dir / filename)
        assert {k: array_sha256(a) for k, a in z.items()} == REFERENCE[name], filename


def test_array_digest_covers_dtype_and_shape():
    a = np.arange(6, dtype=np.int64)
    assert array_sha256(a) != array_sha256(a.reshape(2, 3))
    assert array_sha256(a) != array_sha256(a.astype(np.int32))
    assert array_sha256(a) == array_sha256(a.astype(">i8"))  # byte order does not matter
    assert array_sha256(a[::2]) == array_sha256(np.ascontiguousarray(a[::2]))

