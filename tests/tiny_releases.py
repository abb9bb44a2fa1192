"""Tiny dataset releases in their official layouts (UCI-HAR, CREMA-D, AVE, CMU-MOSEI; the HAPT
raw signals, the FSDD recordings, MNIST's idx files), for the converter, download and loader
tests, stand-ins in the prepared layout at the release's real shapes, and the checks those
tests share on what a converter wrote.

Importable from every test (pytest puts tests/ on sys.path).
"""

from __future__ import annotations

import gzip
import pickle
import wave
import zipfile
from pathlib import Path

import numpy as np
from PIL import Image

#: small converter options for the audio-visual releases: 1 s of audio, 16 mel bands, 8x8 frames
AV = {"seconds": 1.0, "n_mels": 16, "image_size": 8}


def npz(path: Path) -> dict[str, np.ndarray]:
    """Every array of a prepared file, read without pickles."""
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def no_partial(folder: Path) -> bool:
    """No temporary `.part` file left anywhere under `folder`."""
    return not [p for p in Path(folder).rglob("*") if p.name.endswith(".part")]


def nothing_written(folder: Path) -> bool:
    """Neither an output file nor a temporary one in `folder`."""
    return not [p for p in folder.iterdir() if p.suffix in (".npz", ".part")
                or p.name.endswith(".part")]


def uci_har_folder(root: Path, n: tuple[int, int] = (3, 2)) -> Path:
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


def wav(path: Path, seconds: float, rate: int, freq: float,
        sound_until: float | None = None) -> None:
    """A 16-bit mono sine wave, silent after `sound_until` seconds."""
    t = np.arange(int(round(seconds * rate))) / rate
    x = 0.5 * np.sin(2 * np.pi * freq * t)
    if sound_until is not None:
        x[int(sound_until * rate):] = 0.0
    path.parent.mkdir(parents=True, exist_ok=True)
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes((x * 32767).astype("<i2").tobytes())


def frames(folder: Path, values: list[int], names: list[str] | None = None,
           ext: str = ".png") -> None:
    """Constant grey 12x16 frames (centre-cropped to 12x12, then resized: still constant)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, v in zip(names or [str(i + 1) for i in range(len(values))], values):
        Image.fromarray(np.full((12, 16), v, np.uint8)).save(folder / f"{name}{ext}")


def crema(root: Path, actors=(1001, 1002, 1003, 1004, 1005)) -> dict[str, int]:
    """Two clips per actor; clip c has frames 1, 2, 10 valued 50+c, 100+c, 150+c, so natural
    order makes '2' the middle one (name order would pick '10')."""
    clips: dict[str, int] = {}
    for a_i, actor in enumerate(actors):
        for k, emo in enumerate(("ANG", "SAD") if a_i % 2 == 0 else ("HAP", "NEU")):
            c = len(clips)
            clip = f"{actor}_{'DFA' if k == 0 else 'IEO'}_{emo}_XX"
            rate = 8000 if c == 3 else 16000  # one clip needs resampling
            wav(root / "AudioWAV" / f"{clip}.wav", 0.5, rate, 300 if emo == "ANG" else 2000)
            frames(root / "Image-01-FPS" / clip, [50 + c, 100 + c, 150 + c], ["1", "2", "10"])
            clips[clip] = c
    return clips


AVE_ROWS = [("Dog", 0, 1), ("Church bell", 1, 2), ("Male speech, man speaking", 0, 1),
            ("Dog", 0, 2), ("Church bell", 0, 1), ("Dog", 1, 2)]


def ave(root: Path, split_files: bool, rows=AVE_ROWS) -> list[tuple[str, float, float]]:
    """2-s videos at 8 kHz, sound in the first second only; frames 1..4 valued 10*k + v.
    With `split_files`, the first three rows train, the fourth is valid, the rest test."""
    ds = root / "AVE_Dataset"
    lines = ["Category&VideoID&Quality&StartTime&EndTime"]
    for v, (cat, s, e) in enumerate(rows):
        vid = f"vid{v}"
        lines.append(f"{cat}&{vid}&good&{s}&{e}")
        wav(ds / "audio" / f"{vid}.wav", 2.0, 8000, 500 + 100 * v, sound_until=1.0)
        frames(ds / "frames" / vid, [(10 * k + v) % 256 for k in range(1, 5)])
    (ds / "Annotations.txt").write_text("\n".join(lines) + "\n")
    if split_files:
        (ds / "trainSet.txt").write_text("\n".join(lines[1:4]) + "\n")
        (ds / "valSet.txt").write_text(lines[4] + "\n")
        (ds / "testSet.txt").write_text("\n".join(lines[5:]) + "\n")
    return list(rows)


def mosei_split(n: int, sentiments, ids, t: int = 3, seven: bool = False) -> dict:
    """Constant features with step 0 as padding: text 1 then 3, vision 0.5, audio 1 with one
    -inf (COVAREP has them)."""
    text = np.zeros((n, t, 768))
    vision = np.full((n, t, 35), 0.5)
    audio = np.ones((n, t, 74))
    text[:, 1, :] = 1.0  # step 0 is padding (all zero in text, vision, audio)
    text[:, 2, :] = 3.0
    vision[:, 0, :] = 0.0
    audio[:, 0, :] = 0.0
    audio[:, 2, 0] = -np.inf  # COVAREP has -inf; it becomes 0
    lab = np.asarray(sentiments, dtype=np.float64).reshape(n, 1, 1)
    if seven:
        lab = np.concatenate([lab, np.zeros((n, 1, 6))], axis=2)  # sentiment + 6 emotions
    return {"text": text, "vision": vision, "audio": audio, "labels": lab,
            "id": np.asarray(ids)}


def mosei_pickle(path: Path, with_valid: bool = True) -> Path:
    """The aligned pickle: train 4, (valid 2,) test 3 segments of videos a..f."""
    data = {"train": mosei_split(4, [-1.2, 0.0, 0.4, 2.6], ["a[0]", "a[1]", "b[0]", "c[0]"]),
            "test": mosei_split(3, [-0.5, -3.7, 1.5], ["d[0]", "d[1]", "e[0]"], seven=True)}
    if with_valid:
        data["valid"] = mosei_split(2, [0.2, -2.2], ["b[1]", "f[0]"])
    path.write_bytes(pickle.dumps(data))
    return path


def mosei_random_pickle(path: Path, sizes=(16, 4, 6), t: int = 4, seed: int = 0) -> Path:
    """Random features whose mean carries the sign of the sentiment, two segments per video,
    the last step of every segment padding; splits train/valid/test of `sizes`."""
    rng = np.random.default_rng(seed)
    data, video = {}, 0
    for sp, n in zip(("train", "valid", "test"), sizes):
        senti = rng.uniform(-3, 3, n)
        sign = np.where(senti >= 0, 1.0, -1.0)[:, None, None]
        split = {k: rng.normal(size=(n, t, d)) + 0.5 * sign
                 for k, d in (("text", 768), ("vision", 35), ("audio", 74))}
        for a in split.values():
            a[:, -1, :] = 0.0
        split["labels"] = senti.reshape(n, 1, 1)
        split["id"] = np.asarray([f"v{video + i // 2}[{i % 2}]" for i in range(n)])
        video += (n + 1) // 2
        data[sp] = split
    path.write_bytes(pickle.dumps(data))
    return path


#: per-sample shapes `raymm data prepare` writes with its default options, and class counts
STANDIN = {
    "crema_d": ({"audio": (40, 301), "visual": (64, 64)}, 6),     # 3 s, 10 ms hop, 64 px
    "ave": ({"audio": (40, 501), "visual": (64, 64)}, 28),        # 5 s event windows
    "cmu_mosei": ({"text": (768,), "acoustic": (74,), "visual": (35,)}, 2),  # pooled, 2 classes
}
_CONVERTER = {"crema_d": "crema-d", "ave": "ave", "cmu_mosei": "cmu-mosei"}


def write_standin(name: str, path: Path, n_train: int, n_test: int, groups: int = 20,
                  classes: int | None = None, seed: int = 0) -> Path:
    """A file in the prepared layout at the release's real shapes, random values: what a
    scenario written for the release needs to load and build where the release is absent."""
    from raymm.data.releases.common import meta_json
    from raymm.data.releases.generic import split_arrays

    shapes, default_classes = STANDIN[name]
    classes = classes or default_classes
    rng = np.random.default_rng(seed)
    parts = {}
    for sp, n in (("train", n_train), ("test", n_test)):
        parts[sp] = {"x": {m: rng.normal(size=(n, *s)).astype(np.float32)
                           for m, s in shapes.items()},
                     "y": np.arange(n) % classes,
                     "group": np.arange(n) % groups + (0 if sp == "train" else groups),
                     "id": [f"{sp}{i}" for i in range(n)]}
    arrays = split_arrays(tuple(shapes), [f"c{k}" for k in range(classes)], parts,
                          meta_json(converter=_CONVERTER[name], source="stand-in"))
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, **arrays)
    return path


# --------------------------------------------------------------------------- public releases

#: a tiny HAPT raw release: experiment -> (user, samples). Users 1 and 3 train, user 2 tests.
HAPT_EXPERIMENTS = {1: (1, 700), 2: (2, 400), 3: (3, 300)}
#: labels.txt rows (experiment, user, activity, start, end), 1-based inclusive: whole windows
#: come from segments of 128 + 64 k samples; a 127-sample segment gives none; activity 7 (a
#: postural transition) is dropped; experiment 3 is listed first (the converter sorts by user)
HAPT_LABELS = [(3, 3, 6, 10, 200), (1, 1, 5, 1, 128), (1, 1, 7, 129, 200), (1, 1, 1, 201, 455),
               (1, 1, 4, 456, 582), (2, 2, 2, 5, 260), (2, 2, 3, 261, 400)]


def hapt_signal(exp: int, sensor: str, n: int) -> np.ndarray:
    """Distinct values on the sensor's quantisation grid (acc in 1/720 g; gyro in 2^-15 rad/s):
    sample i of axis a is (1000 e + 10 i + a) steps, negated for gyro."""
    steps = 1000 * exp + 10 * np.arange(n)[:, None] + np.arange(3)[None, :]
    return steps / 720.0 if sensor == "acc" else -steps / 2.0**15


def hapt_raw(folder: Path, crlf: bool = False) -> Path:
    """The raw HAPT layout in `folder`: `acc_expXX_userYY.txt`, `gyro_...` (3 numbers a line, as
    `%.17g`, as the release writes them) and `labels.txt`."""
    folder.mkdir(parents=True, exist_ok=True)
    end = "\r\n" if crlf else "\n"
    for exp, (user, n) in HAPT_EXPERIMENTS.items():
        for sensor in ("acc", "gyro"):
            rows = [" ".join(f"{v:.17g}" for v in row) for row in hapt_signal(exp, sensor, n)]
            (folder / f"{sensor}_exp{exp:02d}_user{user:02d}.txt").write_bytes(
                (end.join(rows) + end).encode())
    (folder / "labels.txt").write_bytes(
        "".join(" ".join(map(str, r)) + end for r in HAPT_LABELS).encode())
    return folder


def pcm_wav(path: Path, samples: np.ndarray, rate: int = 8000, channels: int = 1,
            width: int = 2) -> Path:
    """A PCM wav holding `samples` (int16 values; repeated across channels)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = np.repeat(np.asarray(samples, "<i2")[:, None], channels, axis=1)
    with wave.open(str(path), "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(width)
        w.setframerate(rate)
        w.writeframes(data.tobytes() if width == 2 else (data >> 8).astype("i1").tobytes())
    return path


#: (digit, speaker, take, samples) of a tiny FSDD: one recording longer than 1 s (8000 samples)
FSDD_CLIPS = [(0, "theo", 0, 3000), (1, "theo", 0, 9000), (0, "george", 1, 4000),
              (0, "george", 0, 5000), (7, "george", 12, 8000), (1, "yweweler", 3, 100)]


def fsdd_wave(digit: int, speaker: str, take: int, n: int) -> np.ndarray:
    rng = np.random.default_rng(100 * digit + 10 * take + len(speaker))
    return rng.integers(-32768, 32768, n).astype(np.int16)


def fsdd_release(root: Path) -> Path:
    """`root/recordings/{digit}_{speaker}_{take}.wav` (mono 16-bit 8 kHz) and a README beside."""
    for digit, speaker, take, n in FSDD_CLIPS:
        pcm_wav(root / "recordings" / f"{digit}_{speaker}_{take}.wav",
                fsdd_wave(digit, speaker, take, n))
    (root / "README.md").write_text("tiny FSDD\n")
    return root


def idx_bytes(a: np.ndarray) -> bytes:
    """`a` (uint8) in the idx format MNIST uses."""
    head = bytes([0, 0, 8, a.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in a.shape)
    return head + np.ascontiguousarray(a, np.uint8).tobytes()


def mnist_arrays(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Random images; labels cycle through the ten digits (from `seed`)."""
    rng = np.random.default_rng(seed)
    return (rng.integers(0, 256, (n, 28, 28)).astype(np.uint8),
            ((np.arange(n) + seed) % 10).astype(np.uint8))


def mnist_release(folder: Path, n_train: int = 12, n_test: int = 30, gz: bool = True) -> Path:
    """The four MNIST files in `folder` (gzip-compressed as published, or plain as torchvision
    also leaves them)."""
    folder.mkdir(parents=True, exist_ok=True)
    for split, n, seed in (("train", n_train, 1), ("t10k", n_test, 2)):
        x, y = mnist_arrays(n, seed)
        for kind, a in (("images-idx3", x), ("labels-idx1", y)):
            name = f"{split}-{kind}-ubyte"
            data = idx_bytes(a)
            if gz:
                (folder / f"{name}.gz").write_bytes(gzip.compress(data, mtime=0))
            else:
                (folder / name).write_bytes(data)
    return folder


def zip_tree(folder: Path, zpath: Path, top: str = "") -> Path:
    """Zip every file under `folder`, under the folder name `top` inside the zip."""
    with zipfile.ZipFile(zpath, "w", zipfile.ZIP_DEFLATED) as zf:
        for p in sorted(folder.rglob("*")):
            if p.is_file():
                zf.write(p, f"{top}{p.relative_to(folder).as_posix()}")
    return zpath
