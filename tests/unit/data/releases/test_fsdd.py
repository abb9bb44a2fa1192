"""The `fsdd` converter (raymm.data.releases.fsdd) on a tiny release: the repository, its
recordings folder and GitHub's zip; what is not its format is refused."""

from __future__ import annotations

import numpy as np
import pytest

from raymm.data.prepare import prepare
from raymm.errors import DataError

from tiny_releases import FSDD_CLIPS, fsdd_release, fsdd_wave, npz, pcm_wav, zip_tree


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
    _check_tiny_fsdd(npz(res.path))
    assert res.sizes == {"recordings": 6} and res.shapes == {"audio": (8000,)}
    _check_tiny_fsdd(npz(prepare("fsdd", repo / "recordings", tmp_path / "b.npz").path))
    zpath = zip_tree(repo, tmp_path / "gh.zip", top=f"free-spoken-digit-dataset-{'0' * 40}/")
    _check_tiny_fsdd(npz(prepare("fsdd", zpath, tmp_path / "c.npz").path))


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
