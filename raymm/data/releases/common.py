"""What a release module declares, and the helpers its converters share.

A release module declares its `Converter`s (what `raymm data prepare NAME` runs) and its
`Source` (what `raymm data download NAME` fetches and how it is checked; `raymm.data.download`
does the fetching). Converters are pure (no Ray, no network): each checks the release layout,
reads it and returns named arrays; `raymm.data.prepare` writes them. Layout problems are
`DataError`s that name the path, never a numpy/zip/PIL traceback.
"""

from __future__ import annotations

import functools
import inspect
import io
import json
import math
import os
import re
import warnings
import zipfile
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from raymm.errors import DataError, RaymmError

Arrays = dict[str, np.ndarray]


@dataclass(frozen=True)
class Converter:
    """`fn(src, *, progress, **options) -> arrays`; `expects` says what `--from` points at."""

    name: str
    default_file: str
    expects: str
    fn: Callable[..., Arrays]
    source: str | None = None   # the download (`Source.name`) read when `--from` is not given
    #: `array_sha256` of every array of the file the shipped results were made with, where
    #: there is one: `prepare` reports whether its output equals it
    reference: Mapping[str, str] | None = None

    def options(self) -> tuple[str, ...]:
        params = inspect.signature(self.fn).parameters
        return tuple(p for p in params if p not in ("src", "progress"))


@dataclass(frozen=True)
class Remote:
    """One file of a release: saved as `filename`, fetched from the first of `urls` that
    delivers it whole and correct."""

    filename: str
    urls: tuple[str, ...]
    sha256: str | None = None
    md5: str | None = None          # a second published checksum (torchvision's, for MNIST)
    size: int | None = None


@dataclass(frozen=True)
class Contents:
    """The files an archive must hold, for an archive whose own bytes cannot be pinned.

    Members whose base name matches `pattern` (a full match) are the release. There must be
    `count` of them, in one folder of the archive (or of a zip inside it), and
    `manifest_sha256(...)` of their bytes must equal `sha256`. With `text`, CRLF line ends are
    read as LF before hashing, so a copy that only changed line ends still matches.
    """

    pattern: str
    count: int
    sha256: str
    text: bool = False
    what: str = ""          # the files in words, for messages


@dataclass(frozen=True)
class Source:
    """A public release raymm can download. `prepare` names the converters that read it (the
    first is the one `raymm data prepare NAME` means)."""

    name: str
    title: str
    homepage: str
    licence: str
    files: tuple[Remote, ...]
    prepare: tuple[str, ...]
    contents: Contents | None = None
    #: where the file URLs come from at download time: each mirror + the file's name
    mirrors: Callable[[], tuple[str, ...]] | None = None

    def release_path(self, folder: Path) -> Path:
        """What `raymm data prepare --from` takes: the file itself when the release is one file,
        else the folder holding its files."""
        return folder / self.files[0].filename if len(self.files) == 1 else folder

    def downloaded(self, folder: Path) -> bool:
        """Whether every file of the release is in `folder` (not whether it is intact)."""
        return all((folder / f.filename).is_file() for f in self.files)


def meta_json(**info: Any) -> np.ndarray:
    """The `meta_json` entry: source, options and rules as JSON text (no pickle needed)."""
    return np.asarray(json.dumps(info, sort_keys=True))


def strings(values: Sequence[str]) -> np.ndarray:
    """Fixed-width unicode, so the file loads without `allow_pickle`."""
    return np.asarray(list(values), dtype=str) if len(values) else np.zeros(0, dtype="<U1")


def check_range(name: str, value: float, lo: float, hi: float = math.inf) -> None:
    if not lo <= value <= hi:
        bound = f">= {lo}" if hi == math.inf else f"in [{lo}, {hi}]"
        raise RaymmError(f"prepare: --{name.replace('_', '-')} must be {bound}, got {value}")


def progress_bar(items: Sequence, progress: bool, desc: str, unit: str = "clip") -> Iterator:
    # deferred: the bar is drawn only with progress on
    from tqdm import tqdm

    return iter(tqdm(items, desc=desc, unit=unit, disable=not progress, leave=False))


# --------------------------------------------------------------------------- releases as files

Reader = Callable[[], bytes]


@contextmanager
def release_files(src: Path, pattern: str, what: str,
                  expects: str) -> Iterator[tuple[str, dict[str, Reader]]]:
    """The files of a release whose base names match `pattern`, from a folder (searched below
    it, hidden folders skipped) or a zip (a zip inside the zip too): `(where, {name: read})`.

    They must lie in one folder: the one holding the most of them is taken, and two folders
    holding as many is an error (which copy was meant is not guessed). `what` and `expects`
    name the release and what `--from` takes, for the message when none is found.
    """
    rx = re.compile(pattern)
    if src.is_dir():
        found: dict[str, dict[str, Reader]] = {}
        for root, dirs, files in os.walk(src):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            hits = {f: Path(root, f).read_bytes for f in files if rx.fullmatch(f)}
            if hits:
                found[root] = hits
        yield _one_folder(found, "", src, what, expects)
        return
    try:
        with zipfile.ZipFile(src) as zf:
            found = _zip_found(zf, rx)
            inner = [n for n in zf.namelist() if n.lower().endswith(".zip")
                     and not n.startswith("__MACOSX")]
            if not found and len(inner) == 1:
                with zipfile.ZipFile(io.BytesIO(zf.read(inner[0]))) as nested:
                    found = _zip_found(nested, rx)
                    yield _one_folder(found, f"{src}:{inner[0]}:", src, what, expects)
                    return
            yield _one_folder(found, f"{src}:", src, what, expects)
    except (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError) as e:
        raise DataError(f"{src}: unreadable zip ({type(e).__name__}: {e})") from e


def _zip_found(zf: zipfile.ZipFile, rx: re.Pattern) -> dict[str, dict[str, Reader]]:
    found: dict[str, dict[str, Reader]] = {}
    for n in zf.namelist():
        folder, _, base = n.rpartition("/")
        if not n.startswith("__MACOSX") and rx.fullmatch(base):
            found.setdefault(folder, {})[base] = functools.partial(zf.read, n)
    return found


def _one_folder(found: dict[str, dict[str, Reader]], prefix: str, src: Path, what: str,
                expects: str) -> tuple[str, dict[str, Reader]]:
    """`(prefix + folder, files)` of the folder holding most of the files."""
    if not found:
        raise DataError(f"{src}: no {what} files in it (expected {expects})")
    ranked = sorted(found, key=lambda k: -len(found[k]))
    if len(ranked) > 1 and len(found[ranked[0]]) == len(found[ranked[1]]):
        raise DataError(f"{src}: {what} files in more than one folder ({prefix}{ranked[0]} "
                        f"and {prefix}{ranked[1]}); pass the one to read with --from")
    return prefix + ranked[0], found[ranked[0]]


def text_table(data: bytes, where: str, dtype: type[np.generic], columns: int) -> np.ndarray:
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
