"""CREMA-D: acted emotions, audio and video clips of actors.

Converter `crema-d` -> `crema_d.npz` (the generic layout, `generic.py`), and the dataset
`crema_d` that reads it. No download: the release is obtained under its own terms, and `--from`
names it.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from raymm.data.base import register_dataset
from raymm.data.releases.audiovisual import (
    FRAME_DIRS,
    Clip,
    av_options,
    av_parts,
    av_split,
    no_frames_error,
)
from raymm.data.releases.common import Arrays, Converter, Source, meta_json
from raymm.data.releases.generic import (
    AUDIO_VISUAL,
    Release,
    ReleaseLoader,
    group_test_mask,
    release_params,
    split_arrays,
)
from raymm.errors import DataError

CREMA_EMOTIONS = ("ANG", "DIS", "FEA", "HAP", "NEU", "SAD")
_CREMA_NAME = re.compile(r"^(\d{4})_([A-Z]{3})_([A-Z]{3})_([A-Z]{2})$")


def _crema_clips(root: Path) -> list[Clip]:
    wav_dir = root / "AudioWAV"
    if not wav_dir.is_dir():
        raise DataError(f"{root}: no AudioWAV/ folder; --from must be the CREMA-D root "
                        f"(holding AudioWAV/ and VideoFlash/ or extracted frames)")
    clips = []
    for p in sorted(wav_dir.iterdir()):
        if p.name.startswith(".") or p.suffix.lower() != ".wav":
            continue
        m = _CREMA_NAME.match(p.stem)
        if m is None or m.group(3) not in CREMA_EMOTIONS:
            raise DataError(f"{p}: expected <actor>_<sentence>_<emotion>_<level>.wav with an "
                            f"emotion in {', '.join(CREMA_EMOTIONS)}")
        clips.append(Clip(p.stem, CREMA_EMOTIONS.index(m.group(3)), m.group(1), p, None))
    if not clips:
        raise DataError(f"{wav_dir}: no .wav files")
    return clips


def convert_crema_d(src: Path, *, sample_rate: int = 16000, seconds: float = 3.0,
                    n_mels: int = 40, hop_ms: float = 10.0, image_size: int = 64,
                    rgb: bool = False, test_fraction: float = 0.2, skip_missing: bool = False,
                    progress: bool = False) -> Arrays:
    """CREMA-D -> sensors `audio` (log-mel) and `visual` (middle frame); 6 emotions; groups are
    actors, and whole actors go to test (`group_test_mask`)."""
    opt = av_options(sample_rate, seconds, n_mels, hop_ms, image_size, rgb, skip_missing,
                      test_fraction)
    if not src.is_dir():
        raise DataError(f"{src}: --from must be the CREMA-D folder")
    clips = _crema_clips(src)
    frame_dirs = [src / d for d in FRAME_DIRS if (src / d).is_dir()]
    if not frame_dirs:
        raise no_frames_error(src, src / "VideoFlash", ".flv")
    kept, audio, image = av_split(clips, frame_dirs, opt, progress, "crema-d")
    groups = np.asarray([c.group for c in kept])
    split_of = np.where(group_test_mask(groups, test_fraction), "test", "train")
    parts = av_parts(kept, audio, image, split_of, {g: int(g) for g in set(groups)})
    meta = meta_json(
        source=str(src), converter="crema-d", options=opt.as_dict(),
        test_fraction=test_fraction, dropped=len(clips) - len(kept),
        split="whole actors; test = first ceil(f*G) actors by CRC32 of the actor id",
        visual="middle frame, centre square crop, [0,1]",
        audio="log(mel+1e-6), [n_mels, frames], centre crop / zero pad")
    return split_arrays(("audio", "visual"), CREMA_EMOTIONS, parts, meta)


CONVERTER = Converter(
    "crema-d", "crema_d.npz",
    "the CREMA-D root: AudioWAV/*.wav and frames/<clip>/ or Image-01-FPS/<clip>/",
    convert_crema_d)
CONVERTERS = (CONVERTER,)
SOURCE: Source | None = None   # no public download: `--from` names the release


@register_dataset("crema_d")
class CremaDLoader(ReleaseLoader):
    """CREMA-D: 6 emotions, groups are actors (`raymm data prepare crema-d`)."""

    name = "crema_d"
    release = Release(CONVERTER.name, AUDIO_VISUAL)
    Params = release_params(CONVERTER)
