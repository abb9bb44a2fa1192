"""The Free Spoken Digit Dataset (FSDD): 3000 recordings of spoken digits, six speakers.

Converter `fsdd` -> `fsdd_audio_8k.npz`, the audio of the `avdigits` dataset
(raymm/data/avdigits.py); download source `fsdd` (the repository's zip at a pinned commit).
`REFERENCE` pins every array of the file the shipped audio-visual digits results were made with.
"""

from __future__ import annotations

import io
import re
import wave
from pathlib import Path

import numpy as np

from raymm.data.releases.common import (
    Arrays,
    Contents,
    Converter,
    Remote,
    Source,
    progress_bar,
    release_files,
)
from raymm.errors import DataError

FSDD_RATE = 8000             # Hz; every FSDD recording is mono 16-bit PCM at this rate
FSDD_SAMPLES = 8000          # 1 s: longer recordings are cut, shorter ones zero-padded


def fsdd_arrays(clips: list[tuple[str, int, int, np.ndarray]]) -> dict[str, np.ndarray]:
    """`fsdd_audio_8k.npz` from the recordings `(speaker, digit, take, int16 waveform)`.

    Rows are sorted by (speaker name, digit, take); `speaker` indexes the sorted names;
    `orig_length` keeps each recording's true length. Returns the file's keys in its order.
    """
    if not clips:
        raise DataError("fsdd: no recordings")
    clips = sorted(clips, key=lambda c: (c[0], c[1], c[2]))
    names = sorted({c[0] for c in clips})
    audio = np.zeros((len(clips), FSDD_SAMPLES), np.int16)
    for row, (_, _, _, samples) in enumerate(clips):
        n = min(FSDD_SAMPLES, samples.shape[0])
        audio[row, :n] = samples[:n]
    return {
        "audio": audio,
        "label": np.asarray([c[1] for c in clips], np.int64),
        "speaker": np.asarray([names.index(c[0]) for c in clips], np.int64),
        "speaker_names": np.asarray(names, dtype=str),
        "index": np.asarray([c[2] for c in clips], np.int64),
        "orig_length": np.asarray([c[3].shape[0] for c in clips], np.int64),
        "sample_rate": np.asarray(FSDD_RATE, np.int64),
    }


_FSDD_FILE = re.compile(r"(\d)_([a-z]+)_(\d+)\.wav")


def _pcm16_mono(data: bytes, where: str) -> np.ndarray:
    """A wav that must be mono 16-bit PCM at 8 kHz (every FSDD recording is), as int16."""
    try:
        with wave.open(io.BytesIO(data)) as w:
            params = (w.getnchannels(), w.getsampwidth(), w.getframerate())
            frames = w.readframes(w.getnframes())
    except (wave.Error, EOFError) as e:
        raise DataError(f"{where}: unreadable wav ({e})") from e
    if params != (1, 2, FSDD_RATE):
        raise DataError(f"{where}: expected mono 16-bit PCM at {FSDD_RATE} Hz, got "
                        f"{params[0]} channel(s), {8 * params[1]}-bit, {params[2]} Hz")
    if not frames:
        raise DataError(f"{where}: no samples")
    return np.frombuffer(frames, "<i2").astype(np.int16)


def convert_fsdd(src: Path, *, progress: bool = False) -> Arrays:
    """FSDD recordings -> `fsdd_audio_8k.npz` (`fsdd_arrays`): int16 waveforms cut or
    zero-padded to 8000 samples, rows by (speaker, digit, take)."""
    with release_files(src, _FSDD_FILE.pattern, "fsdd", _EXPECTS) as (where, files):
        clips = []
        for name in progress_bar(sorted(files), progress, "fsdd"):
            m = _FSDD_FILE.fullmatch(name)
            assert m is not None
            wave_ = _pcm16_mono(files[name](), f"{where}/{name}")
            clips.append((m[2], int(m[1]), int(m[3]), wave_))
    return fsdd_arrays(clips)


#: `array_sha256` of every array of `fsdd_audio_8k.npz` as the shipped results used it
REFERENCE = {
    "audio": "0d4be29c4276d1401483123574fde0df9e3cf223f6a683ab50a2d0f36ef54034",
    "label": "605251a047dfc237312967e2794b925bfc68d3191aaa759e11472cac80edea20",
    "speaker": "6f57f88df0c49cfc5cd4aea39f33d5a99bd65f0ef72e89830f9ebd7c383d01f2",
    "speaker_names": "c58b4d7c91a1bf6abf4b4b328b53611773b40ca1ef1e0203d08022ca8fa8e35b",
    "index": "a2949d749a25de72ef58967d3f0a5889ba0743b795c60ff4615bf59a5d1f3bc8",
    "orig_length": "641a2bbc667c1df91e1ced9dfc93631a05b9327893a33c3594357f56af41df4c",
    "sample_rate": "b7c3a403d37be2cfade0e3351b801ebb26acc0eef6fd67b31e27ce9635fb20c0",
}

_EXPECTS = ("the Free Spoken Digit Dataset: its recordings/ folder ({digit}_{speaker}_{take}.wav), "
            "the repository, or its zip")
CONVERTERS = (Converter("fsdd", "fsdd_audio_8k.npz", _EXPECTS, convert_fsdd, source="fsdd",
                        reference=REFERENCE),)

FSDD_COMMIT = "26eb9aaf76e81b692f806f9140c2d2777410d7a1"

SOURCE = Source(
    name="fsdd",
    title=f"Free Spoken Digit Dataset, GitHub Jakobovski/free-spoken-digit-dataset at "
          f"commit {FSDD_COMMIT[:7]}",
    homepage="https://github.com/Jakobovski/free-spoken-digit-dataset",
    licence="CC BY-SA 4.0 (its README); cite Jackson et al., Free Spoken Digit Dataset, "
            "Zenodo",
    files=(Remote(
        f"free-spoken-digit-dataset-{FSDD_COMMIT[:7]}.zip",
        (f"https://github.com/Jakobovski/free-spoken-digit-dataset/archive/"
         f"{FSDD_COMMIT}.zip",)),),
    # the 3000 recordings/{digit}_{speaker}_{take}.wav
    contents=Contents(r"\d_[a-z]+_\d+\.wav", 3000,
                      "1801eae019c063377d98f831d3f93574f259475df7332bb0e3d1b080fb5e6959",
                      what="recordings/{digit}_{speaker}_{take}.wav"),
    prepare=("fsdd",),
)
