"""`raymm data download`: public releases fetched from their official source and verified.

What each release is (its files, URLs and checksums: a `Source`) is declared in its module in
`raymm.data.releases`; this module fetches and checks.

Every file of a release is streamed to a hidden `.part` file beside its destination while its
SHA-256 (and MD5, where a published one exists) is computed. Only when every file of the release
has arrived whole and passed its checks are they renamed into place; a cut connection, an HTTP
error or a checksum mismatch deletes every temp file and raises one `DataError` line, so a
failed download leaves nothing behind.

What is checked, in this order of preference:
- the SHA-256 of the file itself, where it is known (`Remote.sha256`);
- for an archive whose own bytes cannot be pinned (GitHub builds its zips on request, and a
  repository may re-pack one), the files it must contain (`Contents`): their count and the
  SHA-256 of a manifest of their SHA-256s. An archive that differs from its pinned SHA-256 is
  still accepted when every file it must contain matches; the result says so.
A file that passes none of the checks is refused. One with no checksum at all is accepted and
reported as not verified (only possible with `--url` pointing at an unknown file and no
`--sha256`).
"""

from __future__ import annotations

import hashlib
import http.client
import io
import os
import re
import urllib.error
import urllib.request
import zipfile
import zlib
from collections.abc import Iterable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from raymm.data.base import data_root
from raymm.data.releases import SOURCES
from raymm.data.releases.common import Contents, Remote, Source
from raymm.errors import DataError, RaymmError
from raymm.io.atomic import staging_file


@dataclass(frozen=True)
class FileResult:
    path: Path
    sha256: str
    size: int
    verified: str | None     # "sha256", "contents" or None (no checksum known)
    already: bool            # the file was there already; nothing was fetched
    note: str = ""           # e.g. why an archive with another SHA-256 was accepted


@dataclass(frozen=True)
class Downloaded:
    source: Source
    path: Path                                  # what `prepare --from` takes
    files: tuple[FileResult, ...] = field(default=())


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def manifest_sha256(members: Iterable[tuple[str, bytes]], text: bool = False) -> str:
    """SHA-256 of the lines `<sha256 of the bytes>  <name>`, sorted by name, one per member
    (CRLF read as LF first with `text`): one checksum that pins many files."""
    lines = []
    for name, data in members:
        if text:
            data = data.replace(b"\r\n", b"\n")
        lines.append(f"{hashlib.sha256(data).hexdigest()}  {name}\n")
    return hashlib.sha256("".join(sorted(lines, key=lambda s: s[66:])).encode()).hexdigest()


def _normalize_sha(value: str | None) -> str | None:
    if value is None:
        return None
    v = value.strip().lower()
    if not re.fullmatch(r"[0-9a-f]{64}", v):
        raise RaymmError(f"download: --sha256 must be 64 hex digits, got {value!r}")
    return v


def download(name: str, out_dir: str | os.PathLike[str] | None = None, *, url: str | None = None,
             sha256: str | None = None, force: bool = False, progress: bool = True,
             timeout: float = 60.0) -> Downloaded:
    """Fetch release `name` into `out_dir` (default `$RAYMM_DATA`) and verify it.

    `url` fetches from a mirror: a URL ending in `/` is a folder holding the files under their
    official names, any other URL is the file itself (one-file releases only). `sha256`
    replaces the pinned checksum of a one-file release. Files already present are checked and
    kept unless `force`.
    """
    if name not in SOURCES:
        raise RaymmError(f"download: no public source known for {name!r}; downloadable: "
                         f"{', '.join(sorted(SOURCES))}")
    src = SOURCES[name]
    expected = _normalize_sha(sha256)
    if len(src.files) > 1:
        if expected:
            raise RaymmError(f"download {name}: --sha256 applies to a one-file release; {name} "
                             f"has {len(src.files)} files, each with its own pinned checksum")
        if url and not url.endswith("/"):
            raise RaymmError(f"download {name}: --url must be a folder URL ending in '/' "
                             f"({name} has {len(src.files)} files, fetched by their names)")
    folder = Path(out_dir).expanduser() if out_dir is not None else data_root()
    mirrors = None
    if src.mirrors and not url:
        try:
            mirrors = src.mirrors()
        except ImportError:  # without torchvision, the mirrors pinned here
            mirrors = None
    plan = []
    for remote in src.files:
        urls = tuple(m + _remote_name(remote) for m in mirrors) if mirrors else remote.urls
        if url:
            urls = (url + _remote_name(remote),) if url.endswith("/") else (url,)
        plan.append((remote, urls))

    results: dict[str, FileResult] = {}
    staged: list[tuple[Path, Path]] = []   # (temp, destination)
    with ExitStack() as cleanup:
        cleanup.callback(_remove, staged)
        for remote, urls in plan:
            dest = folder / remote.filename
            if dest.exists() and not force:
                results[remote.filename] = _check_present(src, remote, dest, expected)
                continue
            tmp = staging_file(dest)
            staged.append((tmp, dest))
            results[remote.filename] = _fetch_verified(src, remote, urls, tmp, dest, expected,
                                                       progress, timeout)
        for tmp, dest in staged:  # every file arrived and passed: now they may appear
            os.replace(tmp, dest)
        staged.clear()
    return Downloaded(src, src.release_path(folder),
                      tuple(results[r.filename] for r in src.files))


def _remote_name(remote: Remote) -> str:
    return remote.urls[0].rsplit("/", 1)[-1] if remote.urls else remote.filename


def _remove(staged: list[tuple[Path, Path]]) -> None:
    for tmp, _ in staged:
        tmp.unlink(missing_ok=True)


def _check_present(src: Source, remote: Remote, dest: Path, expected: str | None) -> FileResult:
    digest = sha256_file(dest)
    try:
        verified, note = _verify(src, remote, dest, digest, expected)
    except DataError as e:
        raise DataError(f"{dest} exists but {e}; pass --force to download it again") from None
    return FileResult(dest, digest, dest.stat().st_size, verified, already=True, note=note)


def _fetch_verified(src: Source, remote: Remote, urls: tuple[str, ...], tmp: Path, dest: Path,
                    expected: str | None, progress: bool, timeout: float) -> FileResult:
    """Try each URL in turn until one delivers a file that passes `_verify`."""
    failures = []
    for u in urls:
        try:
            with open(tmp, "wb") as f:
                digest, md5, size = _fetch(u, f, progress, timeout, f"{src.name} {remote.filename}")
            verified, note = _verify(src, remote, tmp, digest, expected)
            if remote.md5 and md5 != remote.md5 and not expected:  # torchvision's own check
                raise DataError(f"md5 mismatch: got {md5}, expected {remote.md5}")
            return FileResult(dest, digest, size, verified, already=False, note=note)
        except DataError as e:
            failures.append((u, str(e)))
    what = f"download {src.name}"
    if len(failures) == 1:
        u, why = failures[0]
        raise DataError(f"{what}: {u}: {why}; nothing was written")
    tried = "; ".join(f"{u}: {why}" for u, why in failures)
    raise DataError(f"{what}: {remote.filename}: every mirror failed ({tried}); "
                    f"nothing was written")


def _verify(src: Source, remote: Remote, path: Path, digest: str,
            expected: str | None) -> tuple[str | None, str]:
    """("sha256" | "contents" | None, note), or a DataError saying what does not match."""
    want = expected or remote.sha256
    if want and digest == want:
        return "sha256", ""
    if expected:  # the user's own checksum is not second-guessed
        raise DataError(f"sha256 mismatch: got {digest}, expected {expected}")
    if src.contents is not None:
        problem = contents_problem(path, src.contents)
        if problem:
            got = f"its sha256 is {digest}, not the pinned {want}, and " if want else ""
            raise DataError(f"{got}{problem}")
        note = (f"the archive's sha256 differs from the pinned {want}, but the "
                f"{src.contents.count} files it must contain all match") if want else ""
        return "contents", note
    if want:
        raise DataError(f"sha256 mismatch: got {digest}, expected {want}")
    return None, ""


def contents_problem(path: Path, contents: Contents) -> str | None:
    """None when the archive at `path` holds exactly the pinned files, else what is wrong."""
    try:
        with zipfile.ZipFile(path) as zf:
            members = _release_members(zf, contents)
            if members is None:
                inner = [n for n in zf.namelist() if n.lower().endswith(".zip")
                         and not n.startswith("__MACOSX")]
                if len(inner) == 1:
                    with zipfile.ZipFile(io.BytesIO(zf.read(inner[0]))) as nested:
                        members = _release_members(nested, contents)
            if members is None:
                return (f"it holds none of the {contents.count} files the release must contain "
                        f"({contents.what or contents.pattern})")
            folder, found = members
            if len(found) != contents.count:
                return (f"it holds {len(found)} of the {contents.count} files the release must "
                        f"contain (in {folder or 'its top level'})")
            digest = manifest_sha256(found, contents.text)
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError, NotImplementedError) as e:
        return f"it is not a readable zip ({type(e).__name__}: {e})"
    if digest != contents.sha256:
        return (f"its {contents.count} files differ from the pinned release (manifest sha256 "
                f"{digest}, expected {contents.sha256})")
    return None


def _release_members(zf: zipfile.ZipFile,
                     contents: Contents) -> tuple[str, list[tuple[str, bytes]]] | None:
    """The folder with the most matching members and those members, or None."""
    pattern = re.compile(contents.pattern)
    by_folder: dict[str, list[str]] = {}
    for n in zf.namelist():
        if n.startswith("__MACOSX") or n.endswith("/"):
            continue
        folder, _, base = n.rpartition("/")
        if pattern.fullmatch(base):
            by_folder.setdefault(folder, []).append(n)
    if not by_folder:
        return None
    folder = max(by_folder, key=lambda k: len(by_folder[k]))
    return folder, list(_read_all(zf, by_folder[folder]))


def _read_all(zf: zipfile.ZipFile, names: list[str]) -> Iterator[tuple[str, bytes]]:
    for n in names:
        yield n.rpartition("/")[2], zf.read(n)


def _fetch(url: str, f: BinaryIO, progress: bool, timeout: float,
           desc: str) -> tuple[str, str, int]:
    """Stream `url` into `f` with a tqdm bar; returns (sha256, md5, bytes). A DataError
    (without the URL, which the caller adds) for an HTTP or network failure and for a body
    shorter than the Content-Length the server announced."""
    # deferred: the bar is drawn only with progress on
    from tqdm import tqdm

    h, m, n = hashlib.sha256(), hashlib.md5(usedforsecurity=False), 0
    total = None
    req = urllib.request.Request(url, headers={"User-Agent": "raymm"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            length = resp.headers.get("Content-Length")
            total = int(length) if length and length.isdigit() else None
            with tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=desc,
                      disable=not progress, leave=False) as bar:
                while chunk := resp.read(1 << 20):
                    f.write(chunk)
                    h.update(chunk)
                    m.update(chunk)
                    n += len(chunk)
                    bar.update(len(chunk))
    except urllib.error.HTTPError as e:
        raise DataError(f"HTTP {e.code} {e.reason}") from None
    except urllib.error.URLError as e:
        raise DataError(f"{e.reason}") from None
    except http.client.IncompleteRead as e:
        raise DataError(f"connection cut after {n + len(e.partial)} of {total} bytes") from None
    except (OSError, http.client.HTTPException, ValueError) as e:
        raise DataError(f"{type(e).__name__}: {e}") from None
    if total is not None and n != total:
        raise DataError(f"connection cut after {n} of {total} bytes")
    return h.hexdigest(), m.hexdigest(), n
