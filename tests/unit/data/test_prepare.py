"""`raymm data prepare`: each converter on tiny files written in the official release layout."""

import pickle
import zipfile
import zlib
from pathlib import Path

import numpy as np
import pytest

from raymm.app.cli import main
from raymm.data import load_dataset
from raymm.data.prepare import prepare
from raymm.data.releases.crema_d import CREMA_EMOTIONS
from raymm.errors import DataError, RaymmError

from tiny_releases import AV
from tiny_releases import ave as _ave
from tiny_releases import crema as _crema
from tiny_releases import mosei_pickle as _mosei_pickle
from tiny_releases import wav as _wav

SILENCE = float(np.log(np.float32(1e-6)))  # log-mel of an all-zero frame


def _cli(argv):
    """`raymm data ...` through the real entry point: errors -> one line, exit 2."""
    return main(list(argv))


def _npz(path):
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def _no_partial(folder):
    return not [p for p in Path(folder).rglob("*") if p.name.endswith(".part")]


# --------------------------------------------------------------------------- UCI-HAR

def _uci_folder(root, n=(3, 2)):
    """A tiny 'UCI HAR Dataset' folder; window i of split s, file f holds f_code + i + j/1000."""
    top = root / "UCI HAR Dataset"
    for sp, count in zip(("train", "test"), n):
        sig = top / sp / "Inertial Signals"
        sig.mkdir(parents=True)
        for code, stem in enumerate(("total_acc", "body_gyro", "body_acc")):
            for k, axis in enumerate("xyz"):
                rows = [" ".join(f"{10 * code + k + i + j / 1000:.4f}" for j in range(128))
                        for i in range(count)]
                (sig / f"{stem}_{axis}_{sp}.txt").write_text("\n".join(rows) + "\n")
        (top / sp / f"y_{sp}.txt").write_text("\n".join(str(6 - i) for i in range(count)))
        (top / sp / f"subject_{sp}.txt").write_text("\n".join(str(i + 1) for i in range(count)))
    names = ["WALK", "UP", "DOWN", "SIT", "STAND", "LAY"]
    (top / "activity_labels.txt").write_text("".join(f"{i} {c}\n" for i, c in enumerate(names, 1)))
    return top


def _zip_folder(top, zpath, extra_macosx=True):
    with zipfile.ZipFile(zpath, "w") as zf:
        for p in sorted(top.rglob("*")):
            if p.is_file():
                zf.write(p, f"{top.name}/{p.relative_to(top).as_posix()}")
        if extra_macosx:
            zf.writestr("__MACOSX/UCI HAR Dataset/._train", b"junk")
    return zpath


def test_uci_har_folder_to_the_har_npz_layout(tmp_path):
    top = _uci_folder(tmp_path / "rel")
    out = tmp_path / "out" / "har.npz"
    res = prepare("uci-har", top.parent, out)  # the parent of 'UCI HAR Dataset' works too
    z = _npz(out)
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
    top = _uci_folder(tmp_path / "rel")
    monkeypatch.setenv("RAYMM_DATA", str(tmp_path / "data"))
    ref = _npz(prepare("uci-har", top, tmp_path / "ref.npz").path)
    inner = _zip_folder(top, tmp_path / "UCI HAR Dataset.zip")
    outer = tmp_path / "human+activity+recognition+using+smartphones.zip"
    with zipfile.ZipFile(outer, "w") as zf:  # what the UCI site serves: a zip in a zip
        zf.write(inner, "UCI HAR Dataset.zip")
        zf.writestr("UCI HAR Dataset.names", "names")
    for src in (inner, outer):
        res = prepare("uci-har", src, force=True)  # default output: $RAYMM_DATA/uci_har.npz
        assert res.path == tmp_path / "data" / "uci_har.npz"
        got = _npz(res.path)
        for k in ("train_acc", "test_gyro", "train_y", "test_subject", "class_names"):
            assert np.array_equal(got[k], ref[k]), k
    assert load_dataset("har", {"path": "uci_har.npz"}, 0).test.y.tolist() == [5, 4]


def test_uci_har_bad_inputs_fail_cleanly_and_write_nothing(tmp_path, capsys):
    top = _uci_folder(tmp_path / "rel")
    (top / "test" / "Inertial Signals" / "body_gyro_y_test.txt").unlink()
    broken = _zip_folder(top, tmp_path / "broken.zip")
    out = tmp_path / "out"
    argv = ["data", "prepare", "uci-har", "--from", str(broken), "--out", str(out / "a.npz")]
    assert _cli(argv) == 2
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


def test_existing_output_is_kept_unless_force(tmp_path):
    top = _uci_folder(tmp_path / "rel")
    out = tmp_path / "har.npz"
    out.write_bytes(b"old")
    with pytest.raises(DataError, match="already exists; pass --force"):
        prepare("uci-har", top, out)
    assert out.read_bytes() == b"old"
    prepare("uci-har", top, out, force=True)
    assert _npz(out)["train_y"].tolist() == [5, 4, 3] and _no_partial(tmp_path)


# --------------------------------------------------------------------------- audio + frames

def test_crema_d_audio_frames_labels_and_actor_split(tmp_path):
    root = tmp_path / "CREMA-D"
    clips = _crema(root)
    res = prepare("crema-d", root, tmp_path / "crema.npz", test_fraction=0.4, **AV)
    z = _npz(res.path)
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
    rgb = _npz(prepare("crema-d", root, tmp_path / "rgb.npz", rgb=True, **AV).path)
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
    assert not (tmp_path / "y.npz").exists() and _no_partial(tmp_path)


def test_crema_d_video_only_explains_how_to_extract_frames(tmp_path, capsys):
    root = tmp_path / "CREMA-D"
    _wav(root / "AudioWAV" / "1001_DFA_ANG_XX.wav", 0.2, 16000, 300)
    (root / "VideoFlash").mkdir()
    (root / "VideoFlash" / "1001_DFA_ANG_XX.flv").write_bytes(b"FLV\x01")
    out = tmp_path / "c.npz"
    assert _cli(["data", "prepare", "crema-d", "--from", str(root), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "found VideoFlash/*.flv but no pre-extracted frames" in err and "ffmpeg" in err
    assert "Traceback" not in err and not out.exists()
    assert _cli(["data", "prepare", "crema-d", "--from", str(root), "--classes", "7"]) == 2
    assert "--classes does not apply" in capsys.readouterr().err


def test_ave_event_window_midpoint_frame_and_official_split(tmp_path):
    rows = _ave(tmp_path, split_files=True)
    res = prepare("ave", tmp_path, tmp_path / "ave.npz", seconds=1.0, n_mels=8, image_size=4)
    z = _npz(res.path)
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
    z = _npz(res.path)
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


# --------------------------------------------------------------------------- CMU-MOSEI

def test_cmu_mosei_pooling_labels_and_video_groups(tmp_path):
    src = _mosei_pickle(tmp_path / "mosei_senti_data.pkl")
    res = prepare("cmu-mosei", src, tmp_path / "m2.npz")
    z = _npz(res.path)
    assert z["sensors"].tolist() == ["text", "visual", "acoustic"]
    assert z["splits"].tolist() == ["train", "valid", "test"]
    assert res.shapes == {"text": (768,), "visual": (35,), "acoustic": (74,)}
    assert res.sizes == {"train": 4, "valid": 2, "test": 3}
    np.testing.assert_allclose(z["train_text"], 2.0)      # mean of 1 and 3; padding ignored
    np.testing.assert_allclose(z["test_visual"], 0.5)
    assert z["train_acoustic"][0, 0] == pytest.approx(0.5)  # (1 + 0 from -inf) / 2
    np.testing.assert_allclose(z["train_acoustic"][:, 1:], 1.0)
    assert z["class_names"].tolist() == ["negative", "positive"]
    assert z["train_y"].tolist() == [0, 1, 1, 1] and z["test_y"].tolist() == [0, 0, 1]
    # groups = source videos a..f in sorted order; segments of one video share a group
    assert z["train_group"].tolist() == [0, 0, 1, 2] and z["valid_group"].tolist() == [1, 5]
    assert z["test_group"].tolist() == [3, 3, 4]
    z7 = _npz(prepare("cmu-mosei", tmp_path, tmp_path / "m7.npz", classes=7).path)
    assert z7["train_y"].tolist() == [2, 3, 3, 6]    # round(-1.2)=-1, 0, round(0.4)=0, 3
    assert z7["test_y"].tolist() == [3, 0, 5]        # round(-0.5)=0 (half to even), clip -3.7
    assert z7["class_names"].tolist() == ["-3", "-2", "-1", "0", "1", "2", "3"]
    z3 = _npz(prepare("cmu-mosei", src, tmp_path / "m3.npz", classes=3).path)
    assert z3["class_names"].tolist() == ["negative", "neutral", "positive"]
    assert z3["train_y"].tolist() == [0, 1, 1, 2]    # -1.2 -> -1, 0, 0.4 -> 0, 2.6 -> +1
    assert z3["test_y"].tolist() == [1, 0, 2]        # -0.5 -> 0 (half to even), -3.7, 1.5 -> 2
    zt = _npz(prepare("cmu-mosei", src, tmp_path / "mt.npz", keep_time=True).path)
    assert zt["train_text"].shape == (4, 3, 768) and zt["test_acoustic"][0, 2, 0] == 0.0


def test_cmu_mosei_without_valid_and_bad_layouts(tmp_path):
    src = _mosei_pickle(tmp_path / "m.pkl", with_valid=False)
    assert prepare("cmu-mosei", src, tmp_path / "a.npz").sizes == {"train": 4, "test": 3}
    data = pickle.loads(src.read_bytes())
    del data["test"]["vision"]
    src.write_bytes(pickle.dumps(data))
    with pytest.raises(DataError, match=r"\[test\]: no 'vision' / 'visual' / 'facet' key"):
        prepare("cmu-mosei", src, tmp_path / "b.npz")
    data = pickle.loads(_mosei_pickle(src).read_bytes())
    data["train"]["labels"] = data["train"]["labels"][:3]
    src.write_bytes(pickle.dumps(data))
    with pytest.raises(DataError, match=r"\[train\]: sample counts differ"):
        prepare("cmu-mosei", src, tmp_path / "b.npz")
    src.write_bytes(b"not a pickle")
    with pytest.raises(DataError, match="unreadable pickle"):
        prepare("cmu-mosei", src, tmp_path / "b.npz")
    with pytest.raises(RaymmError, match="--classes must be 2, 3 or 7"):
        prepare("cmu-mosei", src, tmp_path / "b.npz", classes=4)
    assert not (tmp_path / "b.npz").exists() and _no_partial(tmp_path)


def test_cli_prepare_prints_a_summary(tmp_path, capsys):
    src = _mosei_pickle(tmp_path / "m.pkl")
    out = tmp_path / "cli.npz"
    assert _cli(["data", "prepare", "cmu-mosei", "--from", str(src), "--out", str(out),
                 "--classes", "7", "--no-progress"]) == 0
    line = capsys.readouterr().out
    assert f"prepared cmu-mosei: {out} (train 4, valid 2, test 3;" in line
    assert "text [768]" in line and "7 classes" in line
    assert _npz(out)["train_y"].tolist() == [2, 3, 3, 6]


# --------------------------------------------------------------------------- the registry

def test_each_release_module_adds_its_converters_once_and_each_option_has_a_flag():
    """Adding a release is one module in `releases.MODULES`: no converter name may shadow
    another's, and every option a converter takes must reach it from `raymm data prepare`."""
    from raymm.app.data_cli import _OPTIONS
    from raymm.data.releases import CONVERTERS, MODULES, SOURCES

    assert sum(len(m.CONVERTERS) for m in MODULES) == len(CONVERTERS)
    assert sum(m.SOURCE is not None for m in MODULES) == len(SOURCES)
    flags = {flag.lstrip("-").replace("-", "_") for flag, _ in _OPTIONS}
    no_flag = {name: sorted(set(c.options()) - flags) for name, c in CONVERTERS.items()}
    assert not any(no_flag.values()), no_flag
