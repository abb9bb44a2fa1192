"""Downloads of datasets with a public URL, checksummed and written atomically.

The file is streamed to a hidden temp name beside its destination while its SHA-256 is
computed, checked against the known (or given) checksum, and only then renamed; a failed,
mismatched or interrupted download leaves nothing behind. Network and HTTP failures are
`DataError`s with one line of explanation.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import re
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from raymm.data.base import data_root
from raymm.errors import DataError, RaymmError
from raymm.io.atomic import atomic_output


@dataclass(frozen=True)
class Source:
    """A downloadable release. `sha256` is None where no trusted checksum is recorded here;
    `prepare` names the converter that turns the file into what raymm reads."""

    name: str
    url: str
    filename: str
    sha256: str | None = None
    prepare: str | None = None


SOURCES: dict[str, Source] = {
    "uci-har": Source(
        name="uci-har",
        url="https://archive.ics.uci.edu/static/public/240/"
            "human+activity+recognition+using+smartphones.zip",
        filename="uci_har_dataset.zip",
        sha256=None,  # not recorded: the computed one is printed so a user can pin it
        prepare="uci-har",
    ),
}


@dataclass(frozen=True)
class Downloaded:
    path: Path
    sha256: str
    size: int
    verified: bool       # a checksum was known and matched
    already: bool        # the file was there already; nothing was fetched


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


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
    """Fetch source `name` into `out_dir` (default `$RAYMM_DATA`).

    `url` overrides the registry's (a mirror); `sha256` overrides its checksum. An existing
    file is kept (and checked when a checksum is known) unless `force`.
    """
    if name not in SOURCES:
        raise RaymmError(f"download: no public URL known for {name!r}; downloadable: "
                         f"{', '.join(sorted(SOURCES))}")
    src = SOURCES[name]
    expected = _normalize_sha(sha256) or src.sha256
    folder = Path(out_dir).expanduser() if out_dir is not None else data_root()
    dest = folder / src.filename
    if dest.exists() and not force:
        digest = sha256_file(dest)
        if expected and digest != expected:
            raise DataError(f"{dest} exists but its sha256 is {digest}, expected {expected}; "
                            f"pass --force to download it again")
        return Downloaded(dest, digest, dest.stat().st_size, bool(expected), already=True)
    with atomic_output(dest) as f:
        digest, size = _fetch(url or src.url, f, progress, timeout, name)
        if expected and digest != expected:  # raised inside: the temp file is deleted
            raise DataError(f"download {name}: sha256 mismatch: got {digest}, expected "
                            f"{expected}; nothing was written")
    return Downloaded(dest, digest, size, bool(expected), already=False)


def _fetch(url: str, f: BinaryIO, progress: bool, timeout: float, desc: str) -> tuple[str, int]:
    """Stream `url` into `f` with a tqdm bar; returns (sha256, bytes)."""
    # deferred: the bar is drawn only with progress on
    from tqdm import tqdm

    h, n = hashlib.sha256(), 0
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
                    n += len(chunk)
                    bar.update(len(chunk))
    except urllib.error.HTTPError as e:
        raise DataError(f"download {desc}: {url}: HTTP {e.code} {e.reason}") from None
    except urllib.error.URLError as e:
        raise DataError(f"download {desc}: {url}: {e.reason}") from None
    except (OSError, http.client.HTTPException, ValueError) as e:
        raise DataError(f"download {desc}: {url}: {type(e).__name__}: {e}") from None
    if total is not None and n != total:
        raise DataError(f"download {desc}: {url}: got {n} of {total} bytes (connection cut)")
    return h.hexdigest(), n
