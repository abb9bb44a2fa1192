"""The `crema-d` converter (raymm.data.releases.crema_d) on a tiny release in the official
layout: audio frames, labels and the actor split; RGB frames, missing files, clear errors."""

import zlib

import numpy as np
import pytest

from raymm.app.cli import main
from raymm.data.prepare import prepare
from raymm.data.releases.crema_d import CREMA_EMOTIONS
from raymm.errors import DataError

from tiny_releases import AV, no_partial, npz
from tiny_releases import crema as _crema
from tiny_releases import wav as _wav

SILENCE = float(np.log(np.float32(1e-6)))  # log-mel of an all-zero frame


def test_crema_d_audio_frames_labels_and_actor_split(tmp_path):
    root = tmp_path / "CREMA-D"
    clips = _crema(root)
    res = prepare("crema-d", root, tmp_path / "crema.npz", test_fraction=0.4, **AV)
    z = npz(res.path)
    assert z["sensors"].tolist() == ["audio", "visual"]
    assert z["splits"].tolist() == ["train", "test"]
    assert z["class_names"].tolist() == list(CREMA_EMOTIONS)
    assert res.sizes == {"train": 6, "test": 4}
    # test = the first ceil(0.4 * 5) = 2 actors ordered by CRC32 of their id
    test_actors = sorted(map(str, range(1001, 1006)), key=lambda g: zlib.crc32(g.encode()))[:2]
    assert sorted(map(str, z["test_group"])) == sorted(test_actors * 2)
    assert not set(z["train_group"]) & set(z["test_group"])
    for sp in ("train", "test"):
        assert z[f"{sp}_audio"].shape[1:] == (16, 101)  # 16 kHz * 1 s / 160 hop + 1
        assert z[f"{sp}_visual"].shape[1:] == (8, 8)
        for i, clip in enumerate(z[f"{sp}_id"]):
            actor, _, emo, _ = clip.split("_")
            assert z[f"{sp}_y"][i] == CREMA_EMOTIONS.index(emo)
            assert z[f"{sp}_group"][i] == int(actor)
            np.testing.assert_allclose(z[f"{sp}_visual"][i], (100 + clips[clip]) / 255, atol=1e-6)
            a = z[f"{sp}_audio"][i]
            # 0.5 s centred in 1 s: 4000 zero samples each side; 512-sample windows every 160
            assert np.allclose(a[:, :23], SILENCE, atol=1e-3) and np.allclose(a[:, 78:], SILENCE,
                                                                                 atol=1e-3)
            assert (a[:, 30:70].max(axis=0) > SILENCE + 10).all()
    ids = {str(c): (sp, i) for sp in ("train", "test") for i, c in enumerate(z[f"{sp}_id"])}
    low = z[ids["1001_DFA_ANG_XX"][0] + "_audio"][ids["1001_DFA_ANG_XX"][1]][:, 50]
    high = z[ids["1001_IEO_SAD_XX"][0] + "_audio"][ids["1001_IEO_SAD_XX"][1]][:, 50]
    assert low.argmax() < high.argmax()  # 300 Hz peaks in a lower mel band than 2 kHz


def test_crema_d_rgb_skip_missing_and_clear_errors(tmp_path):
    root = tmp_path / "CREMA-D"
    _crema(root, actors=(1001, 1002))
    rgb = npz(prepare("crema-d", root, tmp_path / "rgb.npz", rgb=True, **AV).path)
    assert rgb["train_visual"].shape[1:] == (3, 8, 8)
    for f in (root / "Image-01-FPS" / "1002_DFA_HAP_XX").iterdir():
        f.unlink()
    with pytest.raises(DataError, match=r"1 of 4 clips unusable .*1002_DFA_HAP_XX.*--skip-missing"):
        prepare("crema-d", root, tmp_path / "x.npz", **AV)
    res = prepare("crema-d", root, tmp_path / "x.npz", skip_missing=True, **AV)
    assert sum(res.sizes.values()) == 3
    (root / "AudioWAV" / "1002_XXX_BORED_XX.wav").write_bytes(b"")
    with pytest.raises(DataError, match="BORED_XX.wav: expected <actor>_<sentence>_<emotion>"):
        prepare("crema-d", root, tmp_path / "y.npz", **AV)
    with pytest.raises(DataError, match="no AudioWAV/ folder"):
        prepare("crema-d", tmp_path, tmp_path / "y.npz", **AV)
    assert not (tmp_path / "y.npz").exists() and no_partial(tmp_path)


def test_crema_d_video_only_explains_how_to_extract_frames(tmp_path, capsys):
    root = tmp_path / "CREMA-D"
    _wav(root / "AudioWAV" / "1001_DFA_ANG_XX.wav", 0.2, 16000, 300)
    (root / "VideoFlash").mkdir()
    (root / "VideoFlash" / "1001_DFA_ANG_XX.flv").write_bytes(b"FLV\x01")
    out = tmp_path / "c.npz"
    assert main(["data", "prepare", "crema-d", "--from", str(root), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "found VideoFlash/*.flv but no pre-extracted frames" in err and "ffmpeg" in err
    assert "Traceback" not in err and not out.exists()
    assert main(["data", "prepare", "crema-d", "--from", str(root), "--classes", "7"]) == 2
    assert "--classes does not apply" in capsys.readouterr().err
