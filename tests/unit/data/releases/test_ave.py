"""The `ave` converter (raymm.data.releases.ave) on a tiny release in the official layout:
the event window's midpoint frame, the official split or whole videos held out, layout
errors."""

import zlib

import numpy as np
import pytest

from raymm.data.prepare import prepare
from raymm.errors import DataError

from tiny_releases import ave as _ave
from tiny_releases import npz

SILENCE = float(np.log(np.float32(1e-6)))  # log-mel of an all-zero frame


def test_ave_event_window_midpoint_frame_and_official_split(tmp_path):
    rows = _ave(tmp_path, split_files=True)
    res = prepare("ave", tmp_path, tmp_path / "ave.npz", seconds=1.0, n_mels=8, image_size=4)
    z = npz(res.path)
    cats = sorted({r[0] for r in rows})
    assert z["class_names"].tolist() == cats == ["Church bell", "Dog", "Male speech, man speaking"]
    assert res.sizes == {"train": 3, "valid": 1, "test": 2}
    assert z["test_id"].tolist() == ["vid4", "vid5"] and z["valid_id"].tolist() == ["vid3"]
    for sp in ("train", "valid", "test"):
        assert z[f"{sp}_audio"].shape[1:] == (8, 101)  # 1 s at 16 kHz (resampled from 8 kHz)
        for i, vid in enumerate(z[f"{sp}_id"]):
            v = int(vid[3:])
            cat, s, e = rows[v]
            assert z[f"{sp}_y"][i] == cats.index(cat)
            k = min(3, int((s + e) / 2 / 2.0 * 4))  # frame at the event midpoint of 4 over 2 s
            np.testing.assert_allclose(z[f"{sp}_visual"][i], (10 * (k + 1) + v) / 255, atol=1e-6)
            a = z[f"{sp}_audio"][i]
            if (s, e) == (1, 2):  # the event window is the silent second
                assert np.allclose(a, SILENCE, atol=1e-3)
            elif (s, e) == (0, 1):
                assert (a[:, 20:80].max(axis=0) > SILENCE + 10).all()
    groups = np.concatenate([z[f"{sp}_group"] for sp in ("train", "valid", "test")])
    assert sorted(groups.tolist()) == list(range(6))


def test_ave_without_split_files_holds_out_whole_videos(tmp_path):
    _ave(tmp_path, split_files=False)
    res = prepare("ave", tmp_path / "AVE_Dataset", tmp_path / "ave.npz", seconds=1.0, n_mels=8,
                  image_size=4, test_fraction=0.5)
    z = npz(res.path)
    expect = sorted(sorted((f"vid{v}" for v in range(6)),
                           key=lambda g: zlib.crc32(g.encode()))[:3])
    assert res.sizes == {"train": 3, "test": 3} and sorted(z["test_id"].tolist()) == expect


def test_ave_layout_errors(tmp_path):
    _ave(tmp_path, split_files=False)
    ds = tmp_path / "AVE_Dataset"
    ann = (ds / "Annotations.txt").read_text()
    (ds / "Annotations.txt").write_text(ann + "Dog&vidX&good&5\n")
    with pytest.raises(DataError, match=r"Annotations.txt:8: expected Category&VideoID"):
        prepare("ave", tmp_path, tmp_path / "a.npz")
    (ds / "Annotations.txt").write_text(ann)
    (ds / "frames").rename(ds / "elsewhere")
    (ds / "AVE").mkdir()
    (ds / "AVE" / "vid0.mp4").write_bytes(b"\x00")
    with pytest.raises(DataError, match=r"found AVE/\*.mp4 but no pre-extracted frames.*ffmpeg"):
        prepare("ave", tmp_path, tmp_path / "a.npz")
    (ds / "audio").rename(ds / "sound")
    with pytest.raises(DataError, match=r"no audio/ folder.*ffmpeg"):
        prepare("ave", tmp_path, tmp_path / "a.npz")
    with pytest.raises(DataError, match="no Annotations.txt"):
        prepare("ave", ds / "AVE", tmp_path / "a.npz")
    assert not (tmp_path / "a.npz").exists()
