"""AVE (Audio-Visual Event localisation): annotated audio-visual events in videos.

Converter `ave` -> `ave.npz` (the generic layout, `generic.py`), and the dataset `ave` that
reads it. No download: the release is obtained under its own terms, and `--from` names it.
"""

from __future__ import annotations

from collections.abc import Sequence
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

_AVE_SPLIT_FILES = {"train": "trainSet.txt", "valid": "valSet.txt", "test": "testSet.txt"}


def _ave_rows(path: Path) -> list[tuple[str, str, float, float]]:
    """`Category&VideoID&Quality&StartTime&EndTime` lines (the header is skipped)."""
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    rows = []
    for no, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        if not line.strip() or line.startswith("Category&"):
            continue
        f = [s.strip() for s in line.split("&")]
        try:
            if len(f) != 5:
                raise ValueError(f"{len(f)} fields")
            start, end = float(f[3]), float(f[4])
            if not 0 <= start < end:
                raise ValueError(f"start {start} must be >= 0 and < end {end}")
        except ValueError as e:
            raise DataError(f"{path}:{no}: expected Category&VideoID&Quality&StartTime&EndTime "
                            f"({e})") from None
        rows.append((f[0], f[1], start, end))
    if not rows:
        raise DataError(f"{path}: no annotation lines")
    return rows


def _ave_root(src: Path) -> Path:
    for d in (src, src / "AVE_Dataset"):
        if (d / "Annotations.txt").is_file():
            return d
    raise DataError(f"{src}: no Annotations.txt here or in AVE_Dataset/; --from must be the "
                    f"AVE_Dataset folder (or the folder holding it)")


def _first_dir(bases: Sequence[Path], name: str) -> Path | None:
    return next((b / name for b in bases if (b / name).is_dir()), None)


def convert_ave(src: Path, *, sample_rate: int = 16000, seconds: float = 5.0, n_mels: int = 40,
                hop_ms: float = 10.0, image_size: int = 64, rgb: bool = False,
                test_fraction: float = 0.2, skip_missing: bool = False,
                progress: bool = False) -> Arrays:
    """AVE -> `audio` (log-mel of the annotated event window) and `visual` (the frame at the
    event's midpoint); classes are the annotation categories in sorted order (28 in the
    release). The official trainSet/valSet/testSet.txt decide the split when present, else
    whole videos go to test by `group_test_mask`."""
    opt = av_options(sample_rate, seconds, n_mels, hop_ms, image_size, rgb, skip_missing,
                      test_fraction)
    root = _ave_root(src)
    rows = _ave_rows(root / "Annotations.txt")
    bases = list(dict.fromkeys([root, src, root.parent]))
    audio_dir = _first_dir(bases, "audio")
    if audio_dir is None:
        raise DataError(f"{root}: no audio/ folder of pre-extracted wav files; extract them with "
                        f"ffmpeg, e.g.: for f in AVE/*.mp4; do ffmpeg -loglevel error -i \"$f\" "
                        f"-vn -ac 1 -ar 16000 \"audio/$(basename \"$f\" .mp4).wav\"; done")
    frame_dirs = [b / d for b in bases for d in FRAME_DIRS if (b / d).is_dir()]
    if not frame_dirs:
        raise no_frames_error(root, _first_dir(bases, "AVE") or root / "AVE", ".mp4")
    categories = sorted({r[0] for r in rows})
    clips = [Clip(vid, categories.index(cat), vid, audio_dir / f"{vid}.wav", (start, end))
             for cat, vid, start, end in rows]
    kept, audio, image = av_split(clips, frame_dirs, opt, progress, "ave")
    official = {sp: {r[1] for r in _ave_rows(root / f)} for sp, f in _AVE_SPLIT_FILES.items()
                if (root / f).is_file()}
    groups = [c.group for c in kept]
    if "test" in official:
        split_of = np.asarray(["test" if c.id in official["test"] else
                               "valid" if c.id in official.get("valid", ()) else "train"
                               for c in kept])
        rule = "official trainSet/valSet/testSet.txt (unlisted videos -> train)"
    else:
        split_of = np.where(group_test_mask(np.asarray(groups), test_fraction), "test", "train")
        rule = "whole videos; test = first ceil(f*G) videos by CRC32 of the video id"
    group_ids = {g: i for i, g in enumerate(sorted(set(groups)))}
    parts = av_parts(kept, audio, image, split_of, group_ids)
    meta = meta_json(
        source=str(root), converter="ave", options=opt.as_dict(), split=rule,
        test_fraction=test_fraction, dropped=len(clips) - len(kept),
        audio="log(mel+1e-6) of the event window, centre crop / zero pad",
        visual="frame at the event midpoint, frames assumed to span the clip evenly")
    return split_arrays(("audio", "visual"), categories, parts, meta)


CONVERTER = Converter(
    "ave", "ave.npz",
    "the AVE_Dataset folder: Annotations.txt, audio/<VideoID>.wav, frames/<VideoID>/",
    convert_ave)
CONVERTERS = (CONVERTER,)
SOURCE: Source | None = None   # no public download: `--from` names the release


@register_dataset("ave")
class AveLoader(ReleaseLoader):
    """AVE: 28 audio-visual event classes, groups are videos (`raymm data prepare ave`)."""

    name = "ave"
    release = Release(CONVERTER.name, AUDIO_VISUAL)
    Params = release_params(CONVERTER)
