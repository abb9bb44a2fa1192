"""`raymm data prepare`: run a release's converter and write the compact `.npz` raymm reads.

The converters, one module per release, are in `raymm.data.releases` (`CONVERTERS`; each
module's docstring gives its output layout). `prepare` writes their arrays to a temporary name
and renames, so a failed or interrupted conversion never leaves a half-written file. All arrays
are plain numpy, strings fixed-width unicode, so no output needs `allow_pickle`.

For the files the shipped results were made with (`uci_har_hapt_raw_windows.npz`,
`fsdd_audio_8k.npz`, `mnist_test_28x28.npz`) and MNIST's exact training split, the release
modules pin a SHA-256 of every array (`Converter.reference`, gathered in
`raymm.data.releases.REFERENCE`), and `prepare` says whether its output equals them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from raymm.data import har
from raymm.data.base import data_root, resolve_data_path
from raymm.data.releases import CONVERTERS, SOURCES
from raymm.data.releases.common import Arrays
from raymm.errors import DataError, RaymmError
from raymm.io.atomic import atomic_output
from raymm.io.paths import special_file_problem


@dataclass(frozen=True)
class PrepareResult:
    path: Path
    sizes: dict[str, int]                 # split -> samples
    shapes: dict[str, tuple[int, ...]]    # sensor -> per-sample shape
    class_names: tuple[str, ...]
    #: arrays that differ from the converter's reference (empty: identical); None when it
    #: has none
    differs: tuple[str, ...] | None = None


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
    ref = conv.reference
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
