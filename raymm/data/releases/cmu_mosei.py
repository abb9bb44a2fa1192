"""CMU-MOSEI: sentiment of opinion videos, as the commonly distributed aligned features.

Converter `cmu-mosei` -> `cmu_mosei.npz` (the generic layout, `generic.py`), and the dataset
`cmu_mosei` that reads it. No download: the features are obtained under their own terms, and
`--from` names the pickle.
"""

from __future__ import annotations

import pickle
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from raymm.data.base import register_dataset
from raymm.data.releases.common import Arrays, Converter, Source, meta_json
from raymm.data.releases.generic import Release, ReleaseLoader, release_params, split_arrays
from raymm.errors import DataError, RaymmError

MOSEI_SENSORS = {"text": ("text", "text_bert", "language"),
                 "visual": ("vision", "visual", "facet"),
                 "acoustic": ("audio", "acoustic", "covarep")}
_MOSEI_SPLITS = {"train": ("train",), "valid": ("valid", "dev", "val"), "test": ("test",)}
MOSEI_CLASS_NAMES = {2: ("negative", "positive"), 3: ("negative", "neutral", "positive"),
                     7: tuple(str(v) for v in range(-3, 4))}
#: the rule each class count applies to the sentiment score (recorded in meta_json)
MOSEI_LABEL_RULES = {2: "1 if sentiment >= 0 else 0",
                     3: "clip(round_half_even(sentiment), -1, 1) + 1",
                     7: "clip(round_half_even(sentiment), -3, 3) + 3"}


class _ArrayUnpickler(pickle.Unpickler):
    """Unpickles containers of numpy arrays and nothing else. A pickle names the callables it
    runs while loading; a release file from the web is not trusted to name only these."""

    ALLOWED = {("numpy", "ndarray"), ("numpy", "dtype"),
               ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray",
                                                           "_reconstruct"),
               ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
               ("collections", "OrderedDict"), ("builtins", "set"),
               ("builtins", "frozenset"), ("builtins", "bytearray")}

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in self.ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refusing {module}.{name}: only numpy arrays and plain "
                                     "containers are read from a release pickle")


def _load_pickle(path: Path) -> Any:
    """The common aligned pickles were written by Python 2 tools too, hence the latin1 retry."""
    for encoding in ("ASCII", "latin1"):  # ASCII: pickle's own default
        try:
            with open(path, "rb") as f:
                return _ArrayUnpickler(f, encoding=encoding).load()
        except UnicodeDecodeError:
            continue
        except Exception as e:  # noqa: BLE001  any unpickling failure is a bad file here
            raise DataError(f"{path}: unreadable pickle ({type(e).__name__}: {e})") from e
    raise DataError(f"{path}: unreadable pickle (text encoding)")


def _pick(d: dict, names: Sequence[str], where: str) -> Any:
    for n in names:
        if n in d:
            return d[n]
    raise DataError(f"{where}: no {' / '.join(repr(n) for n in names)} key "
                    f"(found {', '.join(map(str, d))})")


def mean_over_steps(x: np.ndarray) -> np.ndarray:
    """`[n, T, d]` -> `[n, d]`, averaging only the steps that are not all zero (the padding of
    the aligned pickles); an all-padding sample stays zero."""
    steps = np.any(x != 0, axis=2)
    count = steps.sum(axis=1, keepdims=True)
    total = (x * steps[..., None]).sum(axis=1)
    return (total / np.maximum(count, 1)).astype(np.float32)


def mosei_labels(sentiment: np.ndarray, classes: int) -> np.ndarray:
    """2 classes: sentiment >= 0 -> 1 (positive), else 0. 7 classes: round half to even,
    clip to [-3, 3], shift to 0..6 (the usual Acc-7 rule). 3 classes (negative, neutral,
    positive, as the FedMChain paper counts them): the same rounding clipped to [-1, 1], so
    |sentiment| <= 0.5 is neutral."""
    if classes == 2:
        return (sentiment >= 0).astype(np.int64)
    k = (classes - 1) // 2
    return (np.clip(np.round(sentiment), -k, k) + k).astype(np.int64)


def _video_ids(raw: Any, n: int, where: str) -> list[str]:
    ids = np.asarray(raw)
    if ids.shape[:1] != (n,):
        raise DataError(f"{where}: 'id' has {ids.shape[:1]} rows, expected {n}")
    ids = ids.reshape(n, -1)[:, 0] if ids.ndim > 1 else ids
    out = [v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in ids]
    return [re.sub(r"\[[^\]]*\]$", "", v) for v in out]  # "video[3]" -> "video"


def _mosei_split(d: Any, where: str, classes: int, keep_time: bool) -> dict:
    if not isinstance(d, dict):
        raise DataError(f"{where}: expected a dict of arrays, got {type(d).__name__}")
    x = {}
    for m, names in MOSEI_SENSORS.items():
        a = np.nan_to_num(np.asarray(_pick(d, names, where), dtype=np.float64),
                          nan=0.0, posinf=0.0, neginf=0.0)  # COVAREP holds -inf
        if a.ndim == 3:
            a = a if keep_time else mean_over_steps(a)
        elif a.ndim != 2 or keep_time:
            raise DataError(f"{where}: {m} must be [n, T, d]" + ("" if a.ndim != 2 else
                            " for --keep-time (it is already pooled)") + f", got {a.shape}")
        x[m] = a.astype(np.float32)
    lab = np.asarray(_pick(d, ("labels", "label", "y"), where), dtype=np.float64)
    n = lab.shape[0] if lab.ndim else 0
    if n == 0 or any(v.shape[0] != n for v in x.values()):
        shapes = ", ".join(f"{m} {v.shape}" for m, v in x.items())
        raise DataError(f"{where}: sample counts differ (labels {lab.shape}, {shapes})")
    sentiment = lab.reshape(n, -1)[:, 0]  # [n,1,1], [n,1] or [n,1,7]: column 0 is sentiment
    if not np.isfinite(sentiment).all():
        raise DataError(f"{where}: non-finite sentiment labels")
    ids = _video_ids(d["id"], n, where) if "id" in d else None
    return {"x": x, "y": mosei_labels(sentiment, classes), "id": ids, "sentiment": sentiment}


def _mosei_file(src: Path) -> Path:
    if src.is_file():
        return src
    pkls = sorted(src.glob("*.pkl"))
    if len(pkls) != 1:
        raise DataError(f"{src}: expected exactly one .pkl file, found {len(pkls)}; "
                        f"pass the pickle itself with --from")
    return pkls[0]


def convert_cmu_mosei(src: Path, *, classes: int = 2, keep_time: bool = False,
                      progress: bool = False) -> Arrays:
    """Pre-extracted CMU-MOSEI features -> sensors `text`, `visual`, `acoustic`.

    Mean-pooled over non-padding time steps by default (`[d]` per sample); `keep_time` keeps
    `[T, d]`. Non-finite features become 0. Groups are source videos ('id' with its segment
    suffix stripped) when the pickle has ids, else one group per sample. The pickle is
    unpickled, so only prepare files you trust.
    """
    if classes not in MOSEI_CLASS_NAMES:
        raise RaymmError(f"prepare: --classes must be 2, 3 or 7, got {classes}")
    path = _mosei_file(src)
    data = _load_pickle(path)
    if not isinstance(data, dict):
        raise DataError(f"{path}: expected a dict with train/valid/test, got {type(data).__name__}")
    raw = {}
    for sp, names in _MOSEI_SPLITS.items():
        if sp == "valid" and not any(k in data for k in names):
            continue
        raw[sp] = _mosei_split(_pick(data, names, str(path)), f"{path} [{sp}]", classes, keep_time)
    dims = {m: {sp: r["x"][m].shape[1:] for sp, r in raw.items()} for m in MOSEI_SENSORS}
    for m, per in dims.items():
        if len(set(per.values())) != 1:
            raise DataError(f"{path}: {m} feature shapes differ between splits: {per}")
    have_ids = all(r["id"] is not None for r in raw.values())
    id_names = sorted({v for r in raw.values() for v in r["id"]}) if have_ids else []
    group_ids = {v: i for i, v in enumerate(id_names)}
    parts, offset = {}, 0
    for sp, r in raw.items():
        n = r["y"].shape[0]
        ids = r["id"] if have_ids else [f"{sp}-{i}" for i in range(n)]
        group = ([group_ids[v] for v in ids] if have_ids else np.arange(offset, offset + n))
        offset += n
        parts[sp] = {"x": r["x"], "y": r["y"], "group": group, "id": ids}
    meta = meta_json(
        source=str(path), converter="cmu-mosei", classes=classes, keep_time=keep_time,
        labels=MOSEI_LABEL_RULES[classes],
        groups="video id" if have_ids else "one per sample",
        pooling="none" if keep_time else "mean over time steps that are not all zero")
    return split_arrays(tuple(MOSEI_SENSORS), MOSEI_CLASS_NAMES[classes], parts, meta)


CONVERTER = Converter(
    "cmu-mosei", "cmu_mosei.npz",
    "an aligned-features pickle ({train,valid,test}: {text, vision, audio, labels})",
    convert_cmu_mosei)
CONVERTERS = (CONVERTER,)
SOURCE: Source | None = None   # no public download: `--from` names the release


@register_dataset("cmu_mosei")
class CmuMoseiLoader(ReleaseLoader):
    """CMU-MOSEI: sentiment (2 or 7 classes), groups are source videos
    (`raymm data prepare cmu-mosei`); the file's `acoustic` is the sensor `audio`."""

    name = "cmu_mosei"
    release = Release(CONVERTER.name, {"text": ("text", "features"),
                                       "audio": ("acoustic", "features"),
                                       "visual": ("visual", "features")})
    Params = release_params(CONVERTER)
