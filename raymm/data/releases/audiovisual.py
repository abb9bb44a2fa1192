"""Audio and frames for the audio-visual releases (`crema-d`, `ave`): a clip's log-mel
spectrogram and one frame, with the options both converters take.

torch, torchaudio, scipy and Pillow are imported only when a clip is converted, so `raymm data`
and the other converters do not pay for them.
"""

from __future__ import annotations

import math
import re
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from raymm.data.releases.common import check_range, progress_bar
from raymm.errors import DataError

FRAME_DIRS = ("Image-01-FPS", "frames")
_IMAGE_EXT = {".jpg", ".jpeg", ".png"}


class LogMel:
    """Fixed-length log-mel spectrogram `[n_mels, 1 + length // hop]` of a mono waveform.

    Resample to `sample_rate`, centre-crop or zero-pad symmetrically to `seconds`, 25 ms
    windows every `hop_ms`, then `log(mel + 1e-6)` (silence sits at log(1e-6) = -13.8).
    """

    def __init__(self, sample_rate: int, seconds: float, n_mels: int, hop_ms: float) -> None:
        # deferred: `raymm data` imports no torch until audio is converted
        import torchaudio

        self.sample_rate = sample_rate
        self.length = int(round(seconds * sample_rate))
        win = int(round(0.025 * sample_rate))
        self.hop = max(1, int(round(hop_ms * sample_rate / 1000)))
        self.mel = torchaudio.transforms.MelSpectrogram(
            sample_rate=sample_rate, n_fft=1 << (win - 1).bit_length(), win_length=win,
            hop_length=self.hop, n_mels=n_mels)

    def __call__(self, wave: np.ndarray, sr: int) -> np.ndarray:
        # deferred: `raymm data` imports no torch until audio is converted
        import torch
        import torchaudio

        with torch.no_grad():
            x = torch.from_numpy(np.ascontiguousarray(wave, dtype=np.float32))
            if sr != self.sample_rate:
                x = torchaudio.functional.resample(x, sr, self.sample_rate)
            n = x.shape[0]
            if n >= self.length:
                start = (n - self.length) // 2
                x = x[start:start + self.length]
            else:
                left = (self.length - n) // 2
                x = torch.nn.functional.pad(x, (left, self.length - n - left))
            return torch.log(self.mel(x) + 1e-6).numpy().astype(np.float32)


def read_wav(path: Path) -> tuple[np.ndarray, int]:
    """Mono float32 in [-1, 1] and its rate; stereo is averaged. (torchaudio.load would need
    torchcodec, so scipy reads the file.)"""
    # deferred: `raymm data list` and other converters need no scipy
    from scipy.io import wavfile

    if not path.is_file():
        raise DataError(f"{path}: audio file not found")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. unknown chunks in the header
            sr, data = wavfile.read(path)
    except (ValueError, OSError, EOFError) as e:
        raise DataError(f"{path}: unreadable wav ({e})") from e
    scale = {np.dtype(np.int16): 2.0**15, np.dtype(np.int32): 2.0**31}
    if data.dtype == np.uint8:
        x = (data.astype(np.float32) - 128.0) / 128.0
    elif data.dtype in scale:
        x = data.astype(np.float32) / np.float32(scale[data.dtype])
    else:
        x = data.astype(np.float32)
    if x.ndim == 2:
        x = x.mean(axis=1)
    if x.size == 0 or not np.isfinite(x).all():
        raise DataError(f"{path}: empty or non-finite audio")
    return x, int(sr)


def read_image(path: Path, size: int, rgb: bool) -> np.ndarray:
    """Centre square crop, bilinear resize to `size`, values in [0, 1]; `[H, W]` grey or
    `[3, H, W]` RGB (the layouts raymm's 2D-CNN encoder takes)."""
    # deferred: only image releases need Pillow
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as src:
            im = src.convert("RGB" if rgb else "L")
            w, h = im.size
            s = min(w, h)
            box = ((w - s) // 2, (h - s) // 2, (w - s) // 2 + s, (h - s) // 2 + s)
            im = im.crop(box).resize((size, size), Image.Resampling.BILINEAR)
            a = np.asarray(im, dtype=np.float32) / 255.0
    except (UnidentifiedImageError, OSError, ValueError) as e:
        raise DataError(f"{path}: unreadable image ({e})") from e
    return a.transpose(2, 0, 1) if rgb else a


def _natural(p: Path) -> list:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", p.name)]


def frame_files(frame_dirs: Sequence[Path], clip: str) -> list[Path]:
    """The clip's frames in natural order (frame2 before frame10), from the first folder
    that has any."""
    for d in frame_dirs:
        c = d / clip
        if c.is_dir():
            files = [p for p in c.iterdir() if p.suffix.lower() in _IMAGE_EXT
                     and not p.name.startswith(".")]
            if files:
                return sorted(files, key=_natural)
    return []


def no_frames_error(root: Path, videos: Path, ext: str) -> DataError:
    have = videos.is_dir() and any(videos.glob(f"*{ext}"))
    found = f"found {videos.name}/*{ext} but " if have else ""
    return DataError(
        f"{root}: {found}no pre-extracted frames "
        f"({' or '.join(d + '/<clip>/' for d in FRAME_DIRS)}"
        f"); raymm does not decode video. Extract them with ffmpeg, e.g. in {root}: "
        f"for f in {videos.name}/*{ext}; do c=$(basename \"$f\" {ext}); mkdir -p \"frames/$c\"; "
        f"ffmpeg -loglevel error -i \"$f\" -vf fps=1 \"frames/$c/%03d.jpg\"; done")


@dataclass(frozen=True)
class Clip:
    id: str                                # file stem: the key for its wav and frame folder
    label: int
    group: str                             # actor or video: never split across train/test
    wav: Path
    window: tuple[float, float] | None     # seconds of the event inside the clip (AVE)


@dataclass(frozen=True)
class AvOptions:
    sample_rate: int
    seconds: float
    n_mels: int
    hop_ms: float
    image_size: int
    rgb: bool
    skip_missing: bool

    def check(self) -> None:
        check_range("sample_rate", self.sample_rate, 1000)
        check_range("seconds", self.seconds, 0.05)
        check_range("n_mels", self.n_mels, 1, 512)
        check_range("hop_ms", self.hop_ms, 1)
        check_range("image_size", self.image_size, 4, 1024)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def av_options(sample_rate: int, seconds: float, n_mels: int, hop_ms: float, image_size: int,
                rgb: bool, skip_missing: bool, test_fraction: float) -> AvOptions:
    """The options the audio-visual converters share, range-checked (`test_fraction` too)."""
    opt = AvOptions(sample_rate, seconds, n_mels, hop_ms, image_size, rgb, skip_missing)
    opt.check()
    check_range("test_fraction", test_fraction, 0.01, 0.99)
    return opt


def _clip_features(clip: Clip, frame_dirs: Sequence[Path], opt: AvOptions,
                   logmel: LogMel) -> tuple[np.ndarray, np.ndarray]:
    """Log-mel of the clip (or of its event window) and the frame at its temporal middle."""
    wave, sr = read_wav(clip.wav)
    duration = wave.shape[0] / sr
    mid = duration / 2
    if clip.window is not None:
        start, end = clip.window
        wave = wave[int(start * sr):int(math.ceil(end * sr))]
        if wave.size == 0:
            raise DataError(f"{clip.wav}: event {start}-{end} s lies past the audio "
                            f"({duration:.2f} s)")
        mid = (start + end) / 2
    frames = frame_files(frame_dirs, clip.id)
    if not frames:
        where = " or ".join(str(d / clip.id) for d in frame_dirs)
        raise DataError(f"{clip.id}: no frames in {where}")
    # frames are taken to cover the clip evenly; for a plain clip this is the middle file
    idx = min(len(frames) - 1, int(mid / duration * len(frames))) if duration > 0 else 0
    return logmel(wave, sr), read_image(frames[idx], opt.image_size, opt.rgb)


def av_split(clips: list[Clip], frame_dirs: Sequence[Path], opt: AvOptions, progress: bool,
              desc: str) -> tuple[list[Clip], np.ndarray, np.ndarray]:
    """Features of every usable clip; unusable ones fail the whole run unless `skip_missing`."""
    logmel = LogMel(opt.sample_rate, opt.seconds, opt.n_mels, opt.hop_ms)
    kept, audio, image, bad = [], [], [], []
    for clip in progress_bar(clips, progress, desc):
        try:
            a, v = _clip_features(clip, frame_dirs, opt, logmel)
        except DataError as e:
            bad.append(str(e))
            continue
        kept.append(clip)
        audio.append(a)
        image.append(v)
    if bad and not opt.skip_missing:
        raise DataError(f"{len(bad)} of {len(clips)} clips unusable (first: {bad[0]}); fix them "
                        f"or pass --skip-missing to drop them")
    if not kept:
        raise DataError(f"no usable clips among {len(clips)} (first problem: {bad[0]})")
    return kept, np.stack(audio), np.stack(image)


def av_parts(kept: list[Clip], audio: np.ndarray, image: np.ndarray,
              split_of: np.ndarray, group_ids: dict[str, int]) -> dict[str, dict]:
    parts = {}
    for sp in ("train", "valid", "test"):
        idx = np.flatnonzero(split_of == sp)
        if idx.size == 0 and sp == "valid":
            continue
        parts[sp] = {"x": {"audio": audio[idx], "visual": image[idx]},
                     "y": np.asarray([kept[i].label for i in idx], dtype=np.int64),
                     "group": np.asarray([group_ids[kept[i].group] for i in idx], dtype=np.int64),
                     "id": [kept[i].id for i in idx]}
    return parts

