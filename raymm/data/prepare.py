"""Converters from official dataset releases to the compact `.npz` files raymm reads.

Pure (no Ray, no network). Each converter checks the release layout, reads it, and returns
named arrays; `prepare()` writes them to a temporary name and renames, so a failed or
interrupted conversion never leaves a half-written file. Layout problems are `DataError`s that
name the path, never a numpy/zip/PIL traceback.

Output layouts (all arrays plain numpy, strings fixed-width unicode, so no `allow_pickle`):
- `uci-har`: the layout `raymm/data/har.py` reads: `{train,test}_{acc,gyro}` `[n, 128, 3]`,
  `{train,test}_{y,subject}`, `class_names`, `sample_rate_hz`.
- `hapt`, `fsdd`, `mnist`, `mnist-train`: the files the HAR and audio-visual digits scenarios
  read, reproduced array for array (`REFERENCE` pins a SHA-256 of every array of the files the
  shipped results were made with; `prepare` says whether the output equals them).
- the others: `sensors`, `class_names`, `splits`, and per split `S`: `S_<sensor>` float32,
  `S_y` int64, `S_group` int64 (actor / video: devices should not share one), `S_id` (clip ids);
  the datasets `crema_d`, `ave` and `cmu_mosei` (raymm/data/release.py) read it.
Every file but the four reproduced ones also carries `meta_json`: source, options and the rules
used (JSON text).
"""

from __future__ import annotations

import dataclasses
import functools
import gzip
import hashlib
import inspect
import io
import json
import math
import os
import pickle
import re
import shutil
import tempfile
import warnings
import wave
import zipfile
import zlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from raymm.data import avdigits, har
from raymm.data.base import data_root, resolve_data_path
from raymm.data.download import SOURCES
from raymm.errors import DataError, RaymmError
from raymm.io.atomic import atomic_output
from raymm.io.paths import special_file_problem

Arrays = dict[str, np.ndarray]


@dataclass(frozen=True)
class Converter:
    """`fn(src, *, progress, **options) -> arrays`; `expects` says what `--from` points at."""

    name: str
    default_file: str
    expects: str
    fn: Callable[..., Arrays]
    source: str | None = None   # the download (`SOURCES`) read when `--from` is not given

    def options(self) -> tuple[str, ...]:
        params = inspect.signature(self.fn).parameters
        return tuple(p for p in params if p not in ("src", "progress"))


@dataclass(frozen=True)
class PrepareResult:
    path: Path
    sizes: dict[str, int]                 # split -> samples
    shapes: dict[str, tuple[int, ...]]    # sensor -> per-sample shape
    class_names: tuple[str, ...]
    #: arrays that differ from `REFERENCE` (empty: identical); None when there is no reference
    differs: tuple[str, ...] | None = None


CONVERTERS: dict[str, Converter] = {}


def _converter(name: str, default_file: str, expects: str,
               source: str | None = None) -> Callable:
    def deco(fn: Callable[..., Arrays]) -> Callable[..., Arrays]:
        CONVERTERS[name] = Converter(name, default_file, expects, fn, source)
        return fn

    return deco


def prepare(name: str, src: str | os.PathLike[str] | None = None,
            out: str | os.PathLike[str] | None = None, *, force: bool = False,
            progress: bool = False, **options: Any) -> PrepareResult:
    """Convert the release at `src` with converter `name` and write it atomically.

    `src` defaults to where `raymm data download` puts the release under `$RAYMM_DATA` (for
    the converters that have a download). `out` defaults to the converter's file under
    `$RAYMM_DATA`; an existing folder gets that file name inside it. An existing output is kept
    unless `force`. Options a converter does not take are a `RaymmError` (not silently ignored).
    """
    if name not in CONVERTERS:
        raise RaymmError(f"prepare: unknown dataset {name!r}; choose one of: "
                         f"{', '.join(sorted(CONVERTERS))}")
    conv = CONVERTERS[name]
    unknown = sorted(set(options) - set(conv.options()))
    if unknown:
        flags = ", ".join("--" + o.replace("_", "-") for o in unknown)
        takes = ", ".join("--" + o.replace("_", "-") for o in conv.options()) or "no options"
        raise RaymmError(f"prepare {name}: {flags} does not apply; it takes {takes}")
    if src is None:
        if conv.source is None:
            raise RaymmError(f"prepare {name}: --from is required ({name} has no download; "
                             f"give {conv.expects})")
        release = SOURCES[conv.source]
        source = release.release_path(data_root())
        missing = [data_root() / f.filename for f in release.files
                   if not (data_root() / f.filename).is_file()]
        if missing:
            more = f" (and {len(missing) - 1} more of its files)" if len(missing) > 1 else ""
            raise DataError(f"prepare {name}: {missing[0]} not found{more}; fetch it with "
                            f"`raymm data download {conv.source}`, or give the release with "
                            f"--from")
    source = Path(src).expanduser() if src is not None else source
    if not source.exists():
        raise DataError(f"prepare {name}: --from path not found: {source} "
                        f"(expected {conv.expects})")

    problem = special_file_problem(source, f"prepare {name}: --from")
    if problem:  # /dev/zero never ends: reading it filled memory until the kernel stepped in
        raise DataError(f"{problem} (expected {conv.expects})")
    dest = Path(out).expanduser() if out is not None else resolve_data_path(conv.default_file)
    if dest.is_dir():
        dest = dest / conv.default_file
    if dest.exists() and not force:
        raise DataError(f"prepare {name}: {dest} already exists; pass --force to replace it")
    arrays = conv.fn(source, progress=progress, **options)
    write_npz_atomic(dest, arrays)
    res = _summarize(dest, arrays)
    ref = REFERENCE.get(name)
    if ref is None:
        return res
    differs = tuple(k for k in sorted(set(ref) | set(arrays))
                    if k not in ref or k not in arrays or array_sha256(arrays[k]) != ref[k])
    return dataclasses.replace(res, differs=differs)


def array_sha256(a: np.ndarray) -> str:
    """SHA-256 of an array's dtype, shape and little-endian C-order bytes."""
    a = np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("<"))
    h = hashlib.sha256(f"{a.dtype.str}{a.shape}".encode())
    h.update(a.tobytes())
    return h.hexdigest()


#: `array_sha256` of every array of the files the shipped HAR and audio-visual digits results
#: were made with (`uci_har_hapt_raw_windows.npz`, `fsdd_audio_8k.npz`, `mnist_test_28x28.npz`)
#: and of MNIST's exact training images and labels: `prepare` reports whether it reproduced them
REFERENCE: dict[str, dict[str, str]] = {
    "hapt": {
        "train_acc": "80b37d4711ab68806d8c64dca414ff8d699d53d5326b537394e4f111368d319f",
        "train_gyro": "25e17c80093648e0c8e3ac34bdd4a26618568b559067f11abcbcc1fb6c266ba8",
        "train_y": "bd0d6650fe6307e2da34de55d0a44380f69dd79f420a97e7fc8c459c8ae30c9b",
        "train_subject": "d75224caf832761f93eece4cf2f71638e9cb2b1976adc00d367c38e773392097",
        "train_exp": "0307571d68dc9f27d8c38132b96282078fbeb372ad3e6a2a87afdba8acb8bb93",
        "train_start": "95c533753fde9cdbc46b2e533343bab35fe272a59aee383c9efe3aad122c628f",
        "test_acc": "3f7858d298eaa0a77d8db53249fffef084a0ca48ec2ce43b87602cdddb4890e9",
        "test_gyro": "beeef47ec9ddec66abacbc92c28f1ab16e57fa561a896a5400ce0259f32a55bc",
        "test_y": "51556a84e1636bdaea0cb6854b3f9d87b4566ecfdf00288c0844f54ac4a64e66",
        "test_subject": "9fd7cec837d7f5db2baf6506b10a705189e56214286512a3adade8a26d9a5250",
        "test_exp": "414f33d3d3438dae83362aec77f057dcc9ed057a570b2b7b3cff8fdc264d1728",
        "test_start": "69db6ebc7dc0c6baeddeb4643713f5b5c5919c502761c9c4a971cb73601b97a1",
        "class_names": "32f32c5740361cb9ad01a7c1facab0e3e899214a637bff5b1c8aa39cb0b0d49f",
        "sample_rate_hz": "a06710b568fdf6b9432a5de9236574d4b349364ae33009edf55b928d51b9493b",
    },
    "fsdd": {
        "audio": "0d4be29c4276d1401483123574fde0df9e3cf223f6a683ab50a2d0f36ef54034",
        "label": "605251a047dfc237312967e2794b925bfc68d3191aaa759e11472cac80edea20",
        "speaker": "6f57f88df0c49cfc5cd4aea39f33d5a99bd65f0ef72e89830f9ebd7c383d01f2",
        "speaker_names": "c58b4d7c91a1bf6abf4b4b328b53611773b40ca1ef1e0203d08022ca8fa8e35b",
        "index": "a2949d749a25de72ef58967d3f0a5889ba0743b795c60ff4615bf59a5d1f3bc8",
        "orig_length": "641a2bbc667c1df91e1ced9dfc93631a05b9327893a33c3594357f56af41df4c",
        "sample_rate": "b7c3a403d37be2cfade0e3351b801ebb26acc0eef6fd67b31e27ce9635fb20c0",
    },
    "mnist": {
        "x": "fbf9701b11f5659e6366884b0bbf01ea129fb049e3239251eddb226ada72239e",
        "y": "bc4f9655c228502ea84fb679f1b5c618ad81c0ca308f62e8b89621010716f3d7",
    },
    "mnist-train": {
        "x": "157fe16da1dbced4a1376f4be5df2d665d51d11177dcaf7aa4848b1ff033343f",
        "y": "709bf8e34a5eecad0ba9e319b1d154e9069f3e5492f2bb65e5da9a7ce1e406b2",
    },
}


def write_npz_atomic(path: Path, arrays: Arrays) -> None:
    """`np.savez_compressed` to a hidden temp file beside `path`, then rename over it."""
    with atomic_output(path) as f:
        # numpy's stub types **kwds beside `allow_pickle: bool`, so mypy wants every array to be
        # a bool too; the arrays are named keyword arguments by design (the npz member names)
        np.savez_compressed(f, **arrays)  # type: ignore[arg-type]


def _summarize(path: Path, arrays: Arrays) -> PrepareResult:
    digits = tuple(str(d) for d in range(10))
    if "speaker" in arrays:  # fsdd
        return PrepareResult(path, {"recordings": int(arrays["label"].shape[0])},
                             {"audio": tuple(arrays["audio"].shape[1:])}, digits)
    if "x" in arrays:  # mnist
        return PrepareResult(path, {"images": int(arrays["y"].shape[0])},
                             {"visual": tuple(arrays["x"].shape[1:])}, digits)
    if "splits" in arrays:
        splits = [str(s) for s in arrays["splits"]]
        sensors = [str(s) for s in arrays["sensors"]]
    else:  # the har layout
        splits, sensors = ["train", "test"], list(har.SENSORS)
    return PrepareResult(
        path=path,
        sizes={s: int(arrays[f"{s}_y"].shape[0]) for s in splits},
        shapes={m: tuple(arrays[f"{splits[0]}_{m}"].shape[1:]) for m in sensors},
        class_names=tuple(str(c) for c in arrays["class_names"]),
    )


def _meta(**info: Any) -> np.ndarray:
    return np.asarray(json.dumps(info, sort_keys=True))


def _strings(values: Sequence[str]) -> np.ndarray:
    return np.asarray(list(values), dtype=str) if len(values) else np.zeros(0, dtype="<U1")


def _split_arrays(sensors: Sequence[str], class_names: Sequence[str], parts: dict[str, dict],
                  meta: np.ndarray) -> Arrays:
    """The generic layout; `parts[split]` holds `x` (sensor -> array), `y`, `group`, `id`."""
    out: Arrays = {"sensors": _strings(sensors), "class_names": _strings(class_names),
                   "splits": _strings(list(parts)), "meta_json": meta}
    for sp, p in parts.items():
        for m in sensors:
            out[f"{sp}_{m}"] = np.ascontiguousarray(p["x"][m], dtype=np.float32)
        out[f"{sp}_y"] = np.asarray(p["y"], dtype=np.int64)
        out[f"{sp}_group"] = np.asarray(p["group"], dtype=np.int64)
        out[f"{sp}_id"] = _strings(p["id"])
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


def _check_range(name: str, value: float, lo: float, hi: float = math.inf) -> None:
    if not lo <= value <= hi:
        bound = f">= {lo}" if hi == math.inf else f"in [{lo}, {hi}]"
        raise RaymmError(f"prepare: --{name.replace('_', '-')} must be {bound}, got {value}")


def _progress(items: Sequence, progress: bool, desc: str, unit: str = "clip") -> Iterator:
    # deferred: the bar is drawn only with progress on
    from tqdm import tqdm

    return iter(tqdm(items, desc=desc, unit=unit, disable=not progress, leave=False))


# --------------------------------------------------------------------------- releases as files

Reader = Callable[[], bytes]


@contextmanager
def _release_files(src: Path, pattern: str, what: str) -> Iterator[tuple[str, dict[str, Reader]]]:
    """The files of a release whose base names match `pattern`, from a folder (searched below
    it, hidden folders skipped) or a zip (a zip inside the zip too): `(where, {name: read})`.

    They must lie in one folder: the one holding the most of them is taken, and two folders
    holding as many is an error (which copy was meant is not guessed).
    """
    rx = re.compile(pattern)
    if src.is_dir():
        found: dict[str, dict[str, Reader]] = {}
        for root, dirs, files in os.walk(src):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            hits = {f: Path(root, f).read_bytes for f in files if rx.fullmatch(f)}
            if hits:
                found[root] = hits
        yield _one_folder(found, "", src, what)
        return
    try:
        with zipfile.ZipFile(src) as zf:
            found = _zip_found(zf, rx)
            inner = [n for n in zf.namelist() if n.lower().endswith(".zip")
                     and not n.startswith("__MACOSX")]
            if not found and len(inner) == 1:
                with zipfile.ZipFile(io.BytesIO(zf.read(inner[0]))) as nested:
                    found = _zip_found(nested, rx)
                    yield _one_folder(found, f"{src}:{inner[0]}:", src, what)
                    return
            yield _one_folder(found, f"{src}:", src, what)
    except (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError) as e:
        raise DataError(f"{src}: unreadable zip ({type(e).__name__}: {e})") from e


def _zip_found(zf: zipfile.ZipFile, rx: re.Pattern) -> dict[str, dict[str, Reader]]:
    found: dict[str, dict[str, Reader]] = {}
    for n in zf.namelist():
        folder, _, base = n.rpartition("/")
        if not n.startswith("__MACOSX") and rx.fullmatch(base):
            found.setdefault(folder, {})[base] = functools.partial(zf.read, n)
    return found


def _one_folder(found: dict[str, dict[str, Reader]], prefix: str, src: Path,
                what: str) -> tuple[str, dict[str, Reader]]:
    """`(prefix + folder, files)` of the folder holding most of the files."""
    if not found:
        raise DataError(f"{src}: no {what} files in it (expected {CONVERTERS[what].expects})")
    ranked = sorted(found, key=lambda k: -len(found[k]))
    if len(ranked) > 1 and len(found[ranked[0]]) == len(found[ranked[1]]):
        raise DataError(f"{src}: {what} files in more than one folder ({prefix}{ranked[0]} "
                        f"and {prefix}{ranked[1]}); pass the one to read with --from")
    return prefix + ranked[0], found[ranked[0]]


def _text_table(data: bytes, where: str, dtype: type[np.generic], columns: int) -> np.ndarray:
    """Whitespace-separated numbers, `columns` per row."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # an empty file warns; the shape check reports it
            a = np.loadtxt(io.BytesIO(data), dtype=dtype, ndmin=2)
    except ValueError as e:
        raise DataError(f"{where}: unreadable ({e})") from e
    if a.shape[0] == 0 or a.shape[1] != columns:
        raise DataError(f"{where}: expected rows of {columns} numbers, got shape {a.shape}")
    return a


# --------------------------------------------------------------------------- UCI-HAR

_UCI_TOP = "UCI HAR Dataset"


def _uci_members() -> list[str]:
    files = []
    for sp in ("train", "test"):
        files += [f"{sp}/Inertial Signals/{s}_{a}_{sp}.txt" for s in har._UCI_STEMS.values()
                  for a in "xyz"]
        files += [f"{sp}/y_{sp}.txt", f"{sp}/subject_{sp}.txt"]
    return files


def _uci_folder(src: Path) -> Path:
    for root in (src, src / _UCI_TOP):
        if (root / "train").is_dir() and (root / "test").is_dir():
            return root
    raise DataError(f"{src}: not a UCI-HAR folder (no train/ and test/ inside it or in "
                    f"'{_UCI_TOP}/'); --from takes the '{_UCI_TOP}' folder or the official zip")


def _uci_zip_prefix(zf: zipfile.ZipFile) -> str | None:
    for n in zf.namelist():
        if n.endswith("train/y_train.txt") and not n.startswith("__MACOSX"):
            return n[: -len("train/y_train.txt")]
    return None


@contextmanager
def _uci_zip_root(path: Path) -> Iterator[Path]:
    """Extract just the needed members into a temp folder. The UCI download wraps the original
    `UCI HAR Dataset.zip` inside another zip, so one level of nesting is opened too."""
    try:
        with zipfile.ZipFile(path) as outer:
            zf, prefix = outer, _uci_zip_prefix(outer)
            inner = [n for n in outer.namelist() if n.lower().endswith(".zip")
                     and not n.startswith("__MACOSX")]
            if prefix is None and len(inner) == 1:
                zf = zipfile.ZipFile(io.BytesIO(outer.read(inner[0])))
                prefix = _uci_zip_prefix(zf)
            if prefix is None:
                raise DataError(f"{path}: no '{_UCI_TOP}/train/y_train.txt' inside; "
                                f"not the UCI-HAR zip")
            tmp = Path(tempfile.mkdtemp(prefix="raymm-uci-"))
            _extract_uci(zf, prefix, tmp, path)
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError) as e:
        raise DataError(f"{path}: unreadable zip ({type(e).__name__}: {e})") from e
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _extract_uci(zf: zipfile.ZipFile, prefix: str, tmp: Path, path: Path) -> None:
    names = set(zf.namelist())
    wanted = _uci_members() + (["activity_labels.txt"]
                               if prefix + "activity_labels.txt" in names else [])
    try:
        for rel in wanted:
            if prefix + rel not in names:
                raise DataError(f"{path}: member '{prefix + rel}' missing")
            dest = tmp / rel  # our own path, never the member name (no zip-slip)
            dest.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(prefix + rel) as r, open(dest, "wb") as w:
                shutil.copyfileobj(r, w)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _uci_arrays(root: Path, shown: str) -> Arrays:
    try:
        splits = {sp: har._read_uci_split(root, sp) for sp in ("train", "test")}
        for sp, raw in splits.items():
            har._check_split(root, sp, raw)
        names = har._read_uci_names(root) or har.CLASS_NAMES
    except DataError as e:  # name the zip, not our temp folder
        raise DataError(str(e).replace(str(root), shown)) from None
    out: Arrays = {}
    for sp, (x, y, subject) in splits.items():
        out |= {f"{sp}_{s}": x[s] for s in har.SENSORS}
        out |= {f"{sp}_y": y, f"{sp}_subject": subject}
    out["class_names"] = _strings(names)
    out["sample_rate_hz"] = np.asarray(50.0)  # UCI-HAR: 50 Hz, 2.56 s windows of 128 samples
    out["meta_json"] = _meta(source=shown, converter="uci-har",
                             sensors={"acc": "total_acc (g)", "gyro": "body_gyro (rad/s)"},
                             labels="y_*.txt minus 1 (0-based)")
    return out


@_converter("uci-har", "uci_har.npz", "the 'UCI HAR Dataset' folder or the official zip",
            source="uci-har")
def convert_uci_har(src: Path, *, progress: bool = False) -> Arrays:
    """Official UCI-HAR (folder or zip, nested zip too) -> the `har` loader's npz layout."""
    if src.is_dir():
        root = _uci_folder(src)
        members = _uci_members()
        missing = [rel for rel in members if not (root / rel).is_file()]
        if missing:
            raise DataError(f"{root}: '{missing[0]}' missing ({len(missing)} of the "
                            f"{len(members)} files needed)")
        return _uci_arrays(root, str(root))
    with _uci_zip_root(src) as root:
        return _uci_arrays(root, f"{src}:")


# --------------------------------------------------------------------------- HAPT raw release

_HAPT_FILES = r"(acc|gyro)_exp\d+_user\d+\.txt|labels\.txt"
_HAPT_SIGNAL = re.compile(r"acc_exp(\d+)_user(\d+)\.txt")


@_converter("hapt", "uci_har_hapt_raw_windows.npz",
            "the HAPT raw release: its RawData folder (acc_expXX_userYY.txt, "
            "gyro_expXX_userYY.txt, labels.txt), a folder above it, or UCI's zip", source="hapt")
def convert_hapt(src: Path, *, progress: bool = False) -> Arrays:
    """HAPT v2.1 raw signals -> `uci_har_hapt_raw_windows.npz` (`har.hapt_windows`): 128-sample
    windows of the raw acc (g) and gyro (rad/s), split by subject as UCI-HAR v1."""
    with _release_files(src, _HAPT_FILES, "hapt") as (where, files):
        if "labels.txt" not in files:
            raise DataError(f"{where}: no labels.txt beside the raw signals")
        labels = _text_table(files["labels.txt"](), f"{where}/labels.txt", np.int64, 5)
        acc_names = sorted(n for n in files if _HAPT_SIGNAL.fullmatch(n))
        orphans = sorted(n for n in files if n.startswith("gyro_")
                         and "acc" + n[4:] not in files)
        if orphans:
            raise DataError(f"{where}: {orphans[0]} has no acc_{orphans[0][5:]} beside it")
        recordings = {}
        for name in _progress(acc_names, progress, "hapt", unit="experiment"):
            m = _HAPT_SIGNAL.fullmatch(name)
            assert m is not None
            gyro_name = "gyro" + name[3:]
            if gyro_name not in files:
                raise DataError(f"{where}: {name} has no {gyro_name} beside it")
            # parsed as float64 and rounded once to float32 (what the reference file holds)
            acc, gyro = (_text_table(files[n](), f"{where}/{n}", np.float64, 3).astype(np.float32)
                         for n in (name, gyro_name))
            if acc.shape != gyro.shape:
                raise DataError(f"{where}: {name} has {acc.shape[0]} samples but {gyro_name} "
                                f"has {gyro.shape[0]}")
            if not (np.isfinite(acc).all() and np.isfinite(gyro).all()):
                raise DataError(f"{where}: {name} or {gyro_name} holds non-finite values")
            recordings[int(m[1])] = (int(m[2]), acc, gyro)
    try:
        return har.hapt_windows(labels, recordings)
    except DataError as e:
        raise DataError(f"{where}/{e}") from None


# --------------------------------------------------------------------------- FSDD

_FSDD_FILE = re.compile(r"(\d)_([a-z]+)_(\d+)\.wav")


def _pcm16_mono(data: bytes, where: str) -> np.ndarray:
    """A wav that must be mono 16-bit PCM at 8 kHz (every FSDD recording is), as int16."""
    try:
        with wave.open(io.BytesIO(data)) as w:
            params = (w.getnchannels(), w.getsampwidth(), w.getframerate())
            frames = w.readframes(w.getnframes())
    except (wave.Error, EOFError) as e:
        raise DataError(f"{where}: unreadable wav ({e})") from e
    if params != (1, 2, avdigits.FSDD_RATE):
        raise DataError(f"{where}: expected mono 16-bit PCM at {avdigits.FSDD_RATE} Hz, got "
                        f"{params[0]} channel(s), {8 * params[1]}-bit, {params[2]} Hz")
    if not frames:
        raise DataError(f"{where}: no samples")
    return np.frombuffer(frames, "<i2").astype(np.int16)


@_converter("fsdd", "fsdd_audio_8k.npz",
            "the Free Spoken Digit Dataset: its recordings/ folder ({digit}_{speaker}_{take}.wav), "
            "the repository, or its zip", source="fsdd")
def convert_fsdd(src: Path, *, progress: bool = False) -> Arrays:
    """FSDD recordings -> `fsdd_audio_8k.npz` (`avdigits.fsdd_arrays`): int16 waveforms cut or
    zero-padded to 8000 samples, rows by (speaker, digit, take)."""
    with _release_files(src, _FSDD_FILE.pattern, "fsdd") as (where, files):
        clips = []
        for name in _progress(sorted(files), progress, "fsdd"):
            m = _FSDD_FILE.fullmatch(name)
            assert m is not None
            wave_ = _pcm16_mono(files[name](), f"{where}/{name}")
            clips.append((m[2], int(m[1]), int(m[3]), wave_))
    return avdigits.fsdd_arrays(clips)


# --------------------------------------------------------------------------- MNIST

_MNIST_FILES = r"(train|t10k)-(images-idx3|labels-idx1)-ubyte(\.gz)?"


def _mnist(src: Path, split: str) -> Arrays:
    """`x` uint8 `[n, 28, 28]` and `y` int64 of MNIST's `split` ("t10k" or "train")."""
    with _release_files(src, _MNIST_FILES, "mnist") as (where, files):
        x, y = (_idx_file(files, f"{split}-{kind}-ubyte", where)
                for kind in ("images-idx3", "labels-idx1"))
    if x.ndim != 3 or x.shape[1:] != (28, 28) or y.ndim != 1 or x.shape[0] != y.shape[0]:
        raise DataError(f"{where}: {split} images {x.shape} and labels {y.shape} do not pair up "
                        f"as [n, 28, 28] and [n]")
    if y.max(initial=0) > 9:
        raise DataError(f"{where}: {split} labels must be digits 0..9, found {int(y.max())}")
    return {"x": x, "y": y.astype(np.int64)}


def _idx_file(files: dict[str, Reader], stem: str, where: str) -> np.ndarray:
    """`stem.gz` (what the download verified) or else `stem` (torchvision unpacks beside it)."""
    if stem + ".gz" in files:
        name = stem + ".gz"
        try:
            data = gzip.decompress(files[name]())
        except (OSError, EOFError, zlib.error) as e:
            raise DataError(f"{where}/{name}: unreadable gzip ({e})") from e
    elif stem in files:
        name, data = stem, files[stem]()
    else:
        raise DataError(f"{where}: no {stem}.gz (or {stem}) in it")
    return avdigits.idx_array(data, f"{where}/{name}")


@_converter("mnist", "mnist_test_28x28.npz",
            "the MNIST idx files (t10k-images-idx3-ubyte.gz, t10k-labels-idx1-ubyte.gz), e.g. "
            "torchvision's MNIST/raw folder", source="mnist")
def convert_mnist(src: Path, *, progress: bool = False) -> Arrays:
    """MNIST's test split (10000 images, original order) -> `mnist_test_28x28.npz`."""
    return _mnist(src, "t10k")


@_converter("mnist-train", "mnist_train_28x28.npz",
            "the MNIST idx files (train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz), e.g. "
            "torchvision's MNIST/raw folder", source="mnist")
def convert_mnist_train(src: Path, *, progress: bool = False) -> Arrays:
    """MNIST's training split (60000 images, original order) -> `mnist_train_28x28.npz`."""
    return _mnist(src, "train")


# --------------------------------------------------------------------------- audio and frames

_FRAME_DIRS = ("Image-01-FPS", "frames")
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


def _no_frames_error(root: Path, videos: Path, ext: str) -> DataError:
    have = videos.is_dir() and any(videos.glob(f"*{ext}"))
    found = f"found {videos.name}/*{ext} but " if have else ""
    return DataError(
        f"{root}: {found}no pre-extracted frames "
        f"({' or '.join(d + '/<clip>/' for d in _FRAME_DIRS)}"
        f"); raymm does not decode video. Extract them with ffmpeg, e.g. in {root}: "
        f"for f in {videos.name}/*{ext}; do c=$(basename \"$f\" {ext}); mkdir -p \"frames/$c\"; "
        f"ffmpeg -loglevel error -i \"$f\" -vf fps=1 \"frames/$c/%03d.jpg\"; done")


@dataclass(frozen=True)
class _Clip:
    id: str                                # file stem: the key for its wav and frame folder
    label: int
    group: str                             # actor or video: never split across train/test
    wav: Path
    window: tuple[float, float] | None     # seconds of the event inside the clip (AVE)


@dataclass(frozen=True)
class _AvOptions:
    sample_rate: int
    seconds: float
    n_mels: int
    hop_ms: float
    image_size: int
    rgb: bool
    skip_missing: bool

    def check(self) -> None:
        _check_range("sample_rate", self.sample_rate, 1000)
        _check_range("seconds", self.seconds, 0.05)
        _check_range("n_mels", self.n_mels, 1, 512)
        _check_range("hop_ms", self.hop_ms, 1)
        _check_range("image_size", self.image_size, 4, 1024)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _av_options(sample_rate: int, seconds: float, n_mels: int, hop_ms: float, image_size: int,
                rgb: bool, skip_missing: bool, test_fraction: float) -> _AvOptions:
    """The options the audio-visual converters share, range-checked (`test_fraction` too)."""
    opt = _AvOptions(sample_rate, seconds, n_mels, hop_ms, image_size, rgb, skip_missing)
    opt.check()
    _check_range("test_fraction", test_fraction, 0.01, 0.99)
    return opt


def _clip_features(clip: _Clip, frame_dirs: Sequence[Path], opt: _AvOptions,
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


def _av_split(clips: list[_Clip], frame_dirs: Sequence[Path], opt: _AvOptions, progress: bool,
              desc: str) -> tuple[list[_Clip], np.ndarray, np.ndarray]:
    """Features of every usable clip; unusable ones fail the whole run unless `skip_missing`."""
    logmel = LogMel(opt.sample_rate, opt.seconds, opt.n_mels, opt.hop_ms)
    kept, audio, image, bad = [], [], [], []
    for clip in _progress(clips, progress, desc):
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


def _av_parts(kept: list[_Clip], audio: np.ndarray, image: np.ndarray,
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


# --------------------------------------------------------------------------- CREMA-D

CREMA_EMOTIONS = ("ANG", "DIS", "FEA", "HAP", "NEU", "SAD")
_CREMA_NAME = re.compile(r"^(\d{4})_([A-Z]{3})_([A-Z]{3})_([A-Z]{2})$")


def _crema_clips(root: Path) -> list[_Clip]:
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
        clips.append(_Clip(p.stem, CREMA_EMOTIONS.index(m.group(3)), m.group(1), p, None))
    if not clips:
        raise DataError(f"{wav_dir}: no .wav files")
    return clips


@_converter("crema-d", "crema_d.npz",
            "the CREMA-D root: AudioWAV/*.wav and frames/<clip>/ or Image-01-FPS/<clip>/")
def convert_crema_d(src: Path, *, sample_rate: int = 16000, seconds: float = 3.0,
                    n_mels: int = 40, hop_ms: float = 10.0, image_size: int = 64,
                    rgb: bool = False, test_fraction: float = 0.2, skip_missing: bool = False,
                    progress: bool = False) -> Arrays:
    """CREMA-D -> sensors `audio` (log-mel) and `visual` (middle frame); 6 emotions; groups are
    actors, and whole actors go to test (`group_test_mask`)."""
    opt = _av_options(sample_rate, seconds, n_mels, hop_ms, image_size, rgb, skip_missing,
                      test_fraction)
    if not src.is_dir():
        raise DataError(f"{src}: --from must be the CREMA-D folder")
    clips = _crema_clips(src)
    frame_dirs = [src / d for d in _FRAME_DIRS if (src / d).is_dir()]
    if not frame_dirs:
        raise _no_frames_error(src, src / "VideoFlash", ".flv")
    kept, audio, image = _av_split(clips, frame_dirs, opt, progress, "crema-d")
    groups = np.asarray([c.group for c in kept])
    split_of = np.where(group_test_mask(groups, test_fraction), "test", "train")
    parts = _av_parts(kept, audio, image, split_of, {g: int(g) for g in set(groups)})
    meta = _meta(source=str(src), converter="crema-d", options=opt.as_dict(),
                 test_fraction=test_fraction, dropped=len(clips) - len(kept),
                 split="whole actors; test = first ceil(f*G) actors by CRC32 of the actor id",
                 visual="middle frame, centre square crop, [0,1]",
                 audio="log(mel+1e-6), [n_mels, frames], centre crop / zero pad")
    return _split_arrays(("audio", "visual"), CREMA_EMOTIONS, parts, meta)


# --------------------------------------------------------------------------- AVE

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


@_converter("ave", "ave.npz",
            "the AVE_Dataset folder: Annotations.txt, audio/<VideoID>.wav, frames/<VideoID>/")
def convert_ave(src: Path, *, sample_rate: int = 16000, seconds: float = 5.0, n_mels: int = 40,
                hop_ms: float = 10.0, image_size: int = 64, rgb: bool = False,
                test_fraction: float = 0.2, skip_missing: bool = False,
                progress: bool = False) -> Arrays:
    """AVE -> `audio` (log-mel of the annotated event window) and `visual` (the frame at the
    event's midpoint); classes are the annotation categories in sorted order (28 in the
    release). The official trainSet/valSet/testSet.txt decide the split when present, else
    whole videos go to test by `group_test_mask`."""
    opt = _av_options(sample_rate, seconds, n_mels, hop_ms, image_size, rgb, skip_missing,
                      test_fraction)
    root = _ave_root(src)
    rows = _ave_rows(root / "Annotations.txt")
    bases = list(dict.fromkeys([root, src, root.parent]))
    audio_dir = _first_dir(bases, "audio")
    if audio_dir is None:
        raise DataError(f"{root}: no audio/ folder of pre-extracted wav files; extract them with "
                        f"ffmpeg, e.g.: for f in AVE/*.mp4; do ffmpeg -loglevel error -i \"$f\" "
                        f"-vn -ac 1 -ar 16000 \"audio/$(basename \"$f\" .mp4).wav\"; done")
    frame_dirs = [b / d for b in bases for d in _FRAME_DIRS if (b / d).is_dir()]
    if not frame_dirs:
        raise _no_frames_error(root, _first_dir(bases, "AVE") or root / "AVE", ".mp4")
    categories = sorted({r[0] for r in rows})
    clips = [_Clip(vid, categories.index(cat), vid, audio_dir / f"{vid}.wav", (start, end))
             for cat, vid, start, end in rows]
    kept, audio, image = _av_split(clips, frame_dirs, opt, progress, "ave")
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
    parts = _av_parts(kept, audio, image, split_of, group_ids)
    meta = _meta(source=str(root), converter="ave", options=opt.as_dict(), split=rule,
                 test_fraction=test_fraction, dropped=len(clips) - len(kept),
                 audio="log(mel+1e-6) of the event window, centre crop / zero pad",
                 visual="frame at the event midpoint, frames assumed to span the clip evenly")
    return _split_arrays(("audio", "visual"), categories, parts, meta)


# --------------------------------------------------------------------------- CMU-MOSEI

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


@_converter("cmu-mosei", "cmu_mosei.npz",
            "an aligned-features pickle ({train,valid,test}: {text, vision, audio, labels})")
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
    meta = _meta(source=str(path), converter="cmu-mosei", classes=classes, keep_time=keep_time,
                 labels=MOSEI_LABEL_RULES[classes],
                 groups="video id" if have_ids else "one per sample",
                 pooling="none" if keep_time else "mean over time steps that are not all zero")
    return _split_arrays(tuple(MOSEI_SENSORS), MOSEI_CLASS_NAMES[classes], parts, meta)
