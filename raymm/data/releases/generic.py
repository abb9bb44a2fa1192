"""The generic layout: how the `crema-d`, `ave` and `cmu-mosei` converters write it and how
the datasets `crema_d`, `ave` and `cmu_mosei` read it.

The file: `sensors`, `class_names`, `splits` (string arrays), and per split `S`: `S_<sensor>`
float32, `S_y` int64, `S_group` int64 (actor / video: devices should not share one), `S_id`
(clip ids), and `meta_json` (source, options and the rules used, as JSON text); all plain numpy,
read with `allow_pickle=False`. `split_arrays` writes it; each release module registers a
`ReleaseLoader` that fixes which converter's file it takes and how the file's sensors become
the dataset's sensors:

- `crema_d`, `ave`: `audio`, `visual`. The converters store log-mel spectrograms as
  `[n_mels, frames]`; the loader exposes `[frames, n_mels]`, the `[T, C]` layout raymm's
  encoders take (a `cnn1d` convolves over time with the mel bands as channels, as for
  `avdigits` and `har`). Frames stay `[H, W]` or `[3, H, W]`.
- `cmu_mosei`: `text`, `audio`, `visual`, in the order of the FedMChain paper's best chain.
  The converter calls the COVAREP features `acoustic`; here they are the sensor `audio`, the
  name the FedMChain scenarios use (docs/methods/fedmchain.md). Features are `[d]` (pooled) or
  `[T, d]` (`--keep-time`).

Devices partition the `train_pool` splits; the file's `test` split is the pooled test split.
Standardisation uses statistics of the training pool only: per mel band, per colour channel
(one value for grey frames), per feature (rows that are all zero are the pickles' padding:
left out of the statistics and left zero). `group` (actor or source video) is kept, so a
`by_group` partition gives each device one actor or video.
"""

from __future__ import annotations

import json
import math
import zipfile
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from raymm.data.base import (
    DataFacts,
    Dataset,
    Split,
    npz_shapes,
    open_npz,
    require_file,
    resolve_data_path,
)
from raymm.data.releases.common import Arrays, Converter, strings
from raymm.errors import DataError

Layout = Literal["spectrogram", "image", "features"]
_READ_ERRORS = (zipfile.BadZipFile, zlib.error, ValueError, OSError, EOFError, KeyError)
#: the file's splits each `train_pool` choice hands to devices (absent ones are skipped)
POOLS = {"train": ("train",), "train+valid": ("train", "valid"),
         "all": ("train", "valid", "test")}


def split_arrays(sensors: Sequence[str], class_names: Sequence[str], parts: dict[str, dict],
                 meta: np.ndarray) -> Arrays:
    """The generic layout; `parts[split]` holds `x` (sensor -> array), `y`, `group`, `id`."""
    out: Arrays = {"sensors": strings(sensors), "class_names": strings(class_names),
                   "splits": strings(list(parts)), "meta_json": meta}
    for sp, p in parts.items():
        for m in sensors:
            out[f"{sp}_{m}"] = np.ascontiguousarray(p["x"][m], dtype=np.float32)
        out[f"{sp}_y"] = np.asarray(p["y"], dtype=np.int64)
        out[f"{sp}_group"] = np.asarray(p["group"], dtype=np.int64)
        out[f"{sp}_id"] = strings(p["id"])
    return out


def group_test_mask(groups: np.ndarray, test_fraction: float) -> np.ndarray:
    """Whole groups go to test: the first ceil(f * G) groups ordered by CRC32 of their name.

    A fixed hash (not a seed) so the split is the same on every machine and every run, and
    not correlated with the numbering of actors or videos.
    """
    uniq = sorted({str(g) for g in groups})
    if len(uniq) < 2:
        raise DataError(f"need at least 2 groups (actors/videos) to split, found {len(uniq)}")
    k = min(len(uniq) - 1, max(1, math.ceil(test_fraction * len(uniq) - 1e-9)))
    test = set(sorted(uniq, key=lambda g: (zlib.crc32(g.encode()), g))[:k])
    return np.asarray([str(g) in test for g in groups], dtype=bool)


@dataclass(frozen=True)
class Release:
    """What one registered name reads: the converter that writes its file, and for each
    dataset sensor (in dataset order) the file's sensor name and its layout."""

    converter: str
    sensors: Mapping[str, tuple[str, Layout]]

    @property
    def file_sensors(self) -> tuple[str, ...]:
        return tuple(f for f, _ in self.sensors.values())


class ReleaseParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    #: the .npz written by `raymm data prepare` (relative paths resolve under $RAYMM_DATA)
    path: str
    #: z-score every sensor with the training pool's statistics
    standardize: bool = True
    #: the file's splits that devices partition: "train", "train+valid" (default: raymm picks
    #: no model on a validation split), or "all" (every sample on a device, as the FedMChain
    #: paper partitions whole datasets; the pooled test split then overlaps training, so it
    #: needs eval.scope: devices)
    train_pool: Literal["train", "train+valid", "all"] = "train+valid"
    #: the number of classes the file must hold (e.g. 3 for the FedMChain paper's CMU-MOSEI,
    #: prepared with --classes 3); None takes what the file holds
    classes: int | None = Field(default=None, ge=2)


RawSplit = tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]  # x by dataset sensor, y, group


class ReleaseLoader:
    """Shared by every prepared-release dataset; subclasses set `name`, `release`, `Params`."""

    name: ClassVar[str]
    release: ClassVar[Release]
    Params: ClassVar[type[ReleaseParams]]

    def sensors(self, params: BaseModel) -> tuple[str, ...]:
        return tuple(self.release.sensors)

    def required_files(self, params: BaseModel) -> list[Path]:
        assert isinstance(params, ReleaseParams)
        return [resolve_data_path(params.path)]

    def check_scenario(self, params: BaseModel, sc: Any) -> list[str]:
        """`train_pool: all` puts the test split on devices: only per-device evaluation is
        then free of samples the model trained on."""
        assert isinstance(params, ReleaseParams)
        if params.train_pool == "all" and sc.eval.scope != "devices":
            return ["dataset.train_pool: 'all' also trains on the file's test split; evaluate "
                    "with eval.scope: devices (or choose train_pool: train+valid)"]
        return []

    def facts(self, params: BaseModel) -> DataFacts | None:
        """From the file's array headers, split list, class names and group columns (a file
        that does not read as this release is left to loading, which says what is wrong)."""
        assert isinstance(params, ReleaseParams)
        path = resolve_data_path(params.path)
        try:
            shapes = npz_shapes(path)
            with open_npz(path) as z:  # member sizes checked: a forged header allocates nothing
                splits = [str(s) for s in z["splits"]]
                classes = len(z["class_names"])
                pool = [sp for sp in POOLS[params.train_pool] if sp in splits]
                groups = np.unique(np.concatenate([z[f"{sp}_group"] for sp in pool]))
            n_train = sum(shapes[f"{sp}_y"][0] for sp in pool)
            sensors = {m: shapes[f"train_{f}"][1:] for m, (f, _) in self.release.sensors.items()}
        except (*_READ_ERRORS, IndexError, DataError):
            return None
        if "train" not in splits or "test" not in splits:
            return None
        # spectrograms are stored [n_mels, frames] and loaded [frames, n_mels]
        return DataFacts(n_train, int(groups.shape[0]), {
            m: s[::-1] if self.release.sensors[m][1] == "spectrogram" else s
            for m, s in sensors.items()}, classes)

    def load(self, params: BaseModel, seed: int) -> Dataset:
        """`seed` is unused: the samples and their splits are fixed by the file."""
        assert isinstance(params, ReleaseParams)
        path = require_file(resolve_data_path(params.path), f"dataset {self.name}")
        if path.is_dir():
            raise DataError(f"{path}: is a folder; {self.name} reads the .npz that "
                            f"`raymm data prepare {self.release.converter} --from {path}` writes")
        pool = list(POOLS[params.train_pool])
        names, parts, meta = read_release(path, self.name, self.release, pool)
        if params.classes is not None and params.classes != len(names):
            raise DataError(f"{path}: holds {len(names)} classes ({', '.join(names)}); "
                            f"dataset.classes asks for {params.classes} (prepare the file "
                            f"again with the class count you want)")
        pool = [sp for sp in pool if sp in parts]
        train = _concat([parts[sp] for sp in pool])
        test = parts["test"]
        stats = _standardize(train[0], test[0], self.release) if params.standardize else {}
        return Dataset(
            name=self.name, sensors=tuple(self.release.sensors), num_classes=len(names),
            train=Split(x=train[0], y=train[1], group=train[2]),
            test=Split(x=test[0], y=test[1], group=test[2]),
            class_names=names,
            meta={"source": str(path), "train_pool": pool, "standardization": stats,
                  "file_sensors": {m: f for m, (f, _) in self.release.sensors.items()},
                  "prepared": meta})


def read_release(path: Path, name: str, release: Release, pool: list[str]
                 ) -> tuple[tuple[str, ...], dict[str, RawSplit], dict[str, Any]]:
    """Class names, the splits needed (the pool's that exist, and `test`) keyed by split, and
    the file's own `meta_json`; every layout problem is one DataError naming the file."""
    try:
        with open_npz(path) as z:
            meta = _check_header(path, z, name, release)
            splits = [str(s) for s in z["splits"]]
            for need in ("train", "test"):
                if need not in splits:
                    raise DataError(f"{path}: no '{need}' split (the file has "
                                    f"{', '.join(splits) or 'none'})")
            names = tuple(str(c) for c in z["class_names"])
            wanted = [sp for sp in dict.fromkeys([*pool, "test"]) if sp in splits]
            parts = {sp: _read_split(path, z, sp, release, len(names)) for sp in wanted}
    except _READ_ERRORS as e:
        raise DataError(f"{path}: unreadable or corrupt .npz ({type(e).__name__}: {e})") from e
    if len(names) < 2:
        raise DataError(f"{path}: class_names lists {len(names)} class(es); need at least 2")
    for m in release.sensors:
        shapes = {sp: p[0][m].shape[1:] for sp, p in parts.items()}
        if len(set(shapes.values())) != 1:
            raise DataError(f"{path}: {m} has different shapes per split: {shapes}")
    return names, parts, meta


def _check_header(path: Path, z: Any, name: str, release: Release) -> dict[str, Any]:
    """The file is the generic layout and was written for this dataset (not, say, a har file
    or another release's)."""
    missing = [k for k in ("sensors", "class_names", "splits") if k not in z.files]
    if missing:
        looks = (" (it looks like the har layout: use dataset: {name: har})"
                 if "train_acc" in z.files else "")
        raise DataError(f"{path}: not a file of `raymm data prepare {release.converter}`: no "
                        f"{', '.join(missing)} key(s){looks}")
    meta: dict[str, Any] = {}
    if "meta_json" in z.files:
        try:
            meta = json.loads(str(z["meta_json"]))
        except json.JSONDecodeError as e:
            raise DataError(f"{path}: meta_json is not JSON ({e})") from e
    wrote = meta.get("converter") if isinstance(meta, dict) else None
    if wrote is not None and wrote != release.converter:
        raise DataError(f"{path}: written by `raymm data prepare {wrote}`, not "
                        f"`{release.converter}`; load it as dataset: "
                        f"{{name: {str(wrote).replace('-', '_')}}}")
    sensors = tuple(str(s) for s in z["sensors"])
    if set(sensors) != set(release.file_sensors):
        raise DataError(f"{path}: sensors {', '.join(sensors) or 'none'}; {name} needs "
                        f"{', '.join(release.file_sensors)} (a file of "
                        f"`raymm data prepare {release.converter}`)")
    return meta if isinstance(meta, dict) else {}


_NDIM = {"spectrogram": (2,), "image": (2, 3), "features": (1, 2)}


def _read_split(path: Path, z: Any, sp: str, release: Release, num_classes: int) -> RawSplit:
    keys = [f"{sp}_{f}" for f in release.file_sensors] + [f"{sp}_y", f"{sp}_group"]
    missing = [k for k in keys if k not in z.files]
    if missing:
        raise DataError(f"{path}: missing key(s) {', '.join(missing)}")
    y = np.asarray(z[f"{sp}_y"])
    if y.ndim != 1 or y.shape[0] == 0 or not np.issubdtype(y.dtype, np.integer):
        raise DataError(f"{path}: {sp}_y must be a non-empty 1-D integer array, got "
                        f"{y.dtype} {y.shape}")
    if y.min() < 0 or y.max() >= num_classes:
        raise DataError(f"{path}: {sp}_y must lie in 0..{num_classes - 1} (class_names)")
    n = y.shape[0]
    group = np.asarray(z[f"{sp}_group"])
    if group.shape != (n,) or not np.issubdtype(group.dtype, np.integer):
        raise DataError(f"{path}: {sp}_group must be {n} integers, got {group.dtype} "
                        f"{group.shape}")
    x = {}
    for m, (f, layout) in release.sensors.items():
        a = np.ascontiguousarray(z[f"{sp}_{f}"], dtype=np.float32)  # views below rely on it
        if a.shape[:1] != (n,) or a.ndim - 1 not in _NDIM[layout]:
            dims = " or ".join(f"{d}-D" for d in _NDIM[layout])
            raise DataError(f"{path}: {sp}_{f} must be {n} {dims} {layout} samples, got "
                            f"{a.shape}")
        if not np.isfinite(a).all():
            raise DataError(f"{path}: {sp}_{f} holds non-finite values")
        # [n, n_mels, frames] -> [n, frames, n_mels]: time first, bands as channels
        x[m] = np.ascontiguousarray(a.transpose(0, 2, 1)) if layout == "spectrogram" else a
    return x, y.astype(np.int64), group.astype(np.int64)


def _concat(parts: list[RawSplit]) -> RawSplit:
    if len(parts) == 1:
        return parts[0]
    x = {m: np.concatenate([p[0][m] for p in parts]) for m in parts[0][0]}
    return x, np.concatenate([p[1] for p in parts]), np.concatenate([p[2] for p in parts])


def _standardize(train: dict[str, np.ndarray], test: dict[str, np.ndarray],
                 release: Release) -> dict[str, Any]:
    """Z-score every sensor in place with the training pool's statistics (no test leakage)."""
    stats = {}
    for m, (_, layout) in release.sensors.items():
        if layout == "features":  # [n, d] or [n, T, d]: per feature, over non-padding rows
            d = train[m].shape[-1]
            tr, te = train[m].reshape(-1, d), test[m].reshape(-1, d)  # views: contiguous
            skip_zero = True
        else:  # spectrogram [n, T, F]: per band; image [n, H, W]: one value; [n, C, H, W]: per C
            ch = 2 if layout == "spectrogram" else 1 if train[m].ndim == 4 else None
            tr, te = _channels_last(train[m], ch), _channels_last(test[m], ch)
            skip_zero = False
        mean, std = _moments(tr, skip_zero)
        for x in (tr, te):
            _apply(x, mean, std, skip_zero)
        stats[m] = {"mean": mean.tolist(), "std": std.tolist()}
    return stats


def _channels_last(x: np.ndarray, channel_axis: int | None) -> np.ndarray:
    """A view with the channels on axis 1: `[rows, C]` when they are the last axis
    (spectrograms), `[n, C, H*W]` for colour images, `[n, 1, H*W]` for grey ones."""
    if channel_axis is None:
        return x.reshape(x.shape[0], 1, -1)
    if channel_axis == x.ndim - 1:
        return x.reshape(-1, x.shape[-1])
    return x.reshape(x.shape[0], x.shape[1], -1)


def _steps(x: np.ndarray) -> range:
    """Chunk starts along axis 0 of about 4M elements each: float64 temporaries stay ~32 MB
    whatever the dataset size."""
    per = max(1, int(np.prod(x.shape[1:])))
    return range(0, x.shape[0], max(1, (1 << 22) // per))


def _moments(x: np.ndarray, skip_zero: bool) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel mean and std (float64) of `[rows, C]` or `[n, C, P]`, accumulated in
    chunks; with `skip_zero`, `[rows, C]` rows that are all zero are left out."""
    axes = (0,) if x.ndim == 2 else (0, 2)
    total, squares, count = np.zeros(x.shape[1]), np.zeros(x.shape[1]), 0
    step = _steps(x)
    for i in step:
        c = x[i:i + step.step].astype(np.float64)
        if skip_zero:
            c = c[c.any(axis=1)]
        total += c.sum(axis=axes)
        squares += np.square(c).sum(axis=axes)
        count += c.size // x.shape[1]
    if count == 0:
        raise DataError("every training sample of a feature sensor is all zero")
    mean = total / count
    std = np.sqrt(np.maximum(squares / count - mean**2, 0.0))
    return mean, np.maximum(std, 1e-8)


def _apply(x: np.ndarray, mean: np.ndarray, std: np.ndarray, skip_zero: bool) -> None:
    """(x - mean) / std in place, per channel (axis 1); all-zero rows stay zero with
    `skip_zero`."""
    m32, s32 = mean.astype(np.float32), std.astype(np.float32)
    if x.ndim == 3:
        m32, s32 = m32[:, None], s32[:, None]
    if not skip_zero:
        x -= m32
        x /= s32
        return
    step = _steps(x)
    for i in step:
        c = x[i:i + step.step]
        keep = c.any(axis=1)
        c[keep] = (c[keep] - m32) / s32


def release_params(converter: Converter) -> type[ReleaseParams]:
    """A Params model whose `path` defaults to the converter's default output."""
    default = converter.default_file

    class Params(ReleaseParams):
        path: str = default

    Params.__name__ = Params.__qualname__ = f"{converter.name.replace('-', '_')}_params"
    return Params


#: the sensors of the audio-visual releases (crema-d, ave): file sensor and layout
AUDIO_VISUAL: dict[str, tuple[str, Layout]] = {"audio": ("audio", "spectrogram"),
                                               "visual": ("visual", "image")}
