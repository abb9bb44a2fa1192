"""`raymm data prepare` (raymm.data.prepare): an existing output is kept unless forced, a
release without `--from` says how to get it; array digests. With the real releases
(RAYMM_RELEASE_HAPT, RAYMM_RELEASE_FSDD, RAYMM_RELEASE_MNIST): the output is compared with the
reference files array by array (dtype and shape included), against the pinned digests and,
where RAYMM_DATA holds them, against the files themselves. Each converter on its tiny
release: data/releases/test_<release>.py."""

import os
from pathlib import Path

import numpy as np
import pytest

from raymm.app.cli import main
from raymm.data.prepare import array_sha256, prepare
from raymm.data.releases import REFERENCE
from raymm.errors import DataError, RaymmError

from tiny_releases import no_partial, npz, uci_har_folder


def test_existing_output_is_kept_unless_force(tmp_path):
    top = uci_har_folder(tmp_path / "rel")
    out = tmp_path / "har.npz"
    out.write_bytes(b"old")
    with pytest.raises(DataError, match="already exists; pass --force"):
        prepare("uci-har", top, out)
    assert out.read_bytes() == b"old"
    prepare("uci-har", top, out, force=True)
    assert npz(out)["train_y"].tolist() == [5, 4, 3] and no_partial(tmp_path)


def test_prepare_without_from_says_how_to_get_the_release(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("RAYMM_DATA", str(tmp_path))
    assert main(["data", "prepare", "hapt", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "hapt_dataset.zip not found; fetch it with `raymm data download hapt`" in err
    assert err.count("\n") == 1
    with pytest.raises(RaymmError, match=r"--from is required \(crema-d has no download"):
        prepare("crema-d")


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
    got = npz(res.path)
    assert res.differs == ()
    assert {k: array_sha256(a) for k, a in got.items()} == REFERENCE[name]
    ref = _reference_file(filename)
    if ref is not None:  # RAYMM_DATA holds the file itself: every array, dtype and shape
        _assert_identical(got, npz(ref))


def test_real_mnist_training_images_against_the_reconstruction(tmp_path):
    """The exact training images; `mnist_train_28x28_recon.npz` (RAYMM_DATA) is within 1 grey
    level of them (measured: 97.24% of pixels equal, 3255 of 60000 images exact)."""
    src = _release("mnist")
    res = prepare("mnist-train", src, tmp_path / "train.npz")
    assert res.differs == () and res.sizes == {"images": 60000}
    recon = _reference_file("mnist_train_28x28_recon.npz")
    if recon is None:
        pytest.skip("RAYMM_DATA holds no mnist_train_28x28_recon.npz to compare with")
    exact, approx = npz(res.path), npz(recon)
    assert np.array_equal(exact["y"], approx["y"])
    diff = np.abs(exact["x"].astype(np.int16) - approx["x"].astype(np.int16))
    assert diff.max() == 1 and (diff == 0).mean() > 0.97


def test_the_pinned_digests_are_those_of_the_reference_files(data_dir):
    """REFERENCE pins the very files in RAYMM_DATA (the ones the shipped results used)."""
    for name, (_, filename, _) in RELEASES.items():
        z = npz(data_dir / filename)
        assert {k: array_sha256(a) for k, a in z.items()} == REFERENCE[name], filename


def test_array_digest_covers_dtype_and_shape():
    a = np.arange(6, dtype=np.int64)
    assert array_sha256(a) != array_sha256(a.reshape(2, 3))
    assert array_sha256(a) != array_sha256(a.astype(np.int32))
    assert array_sha256(a) == array_sha256(a.astype(">i8"))  # byte order does not matter
    assert array_sha256(a[::2]) == array_sha256(np.ascontiguousarray(a[::2]))
