"""UCI-HAR v1 (UCI ML Repository dataset 240): its own pre-filtered windows.

Converter `uci-har` -> `uci_har.npz`, the layout the `har` dataset (raymm/data/har.py) reads:
`{train,test}_{acc,gyro}` float32 `[n, 128, 3]`, `{train,test}_{y,subject}`, `class_names`,
`sample_rate_hz`, `meta_json`. The `har` dataset reads the official folder itself too, with the
same parsing (`har._read_uci_split`); the shipped HAR scenarios read `hapt`'s file instead.
"""

from __future__ import annotations

import io
import shutil
import tempfile
import zipfile
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from raymm.data import har
from raymm.data.releases.common import Arrays, Converter, Remote, Source, meta_json, strings
from raymm.errors import DataError

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
    out["class_names"] = strings(names)
    out["sample_rate_hz"] = np.asarray(50.0)  # UCI-HAR: 50 Hz, 2.56 s windows of 128 samples
    out["meta_json"] = meta_json(source=shown, converter="uci-har",
                                  sensors={"acc": "total_acc (g)", "gyro": "body_gyro (rad/s)"},
                                  labels="y_*.txt minus 1 (0-based)")
    return out


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


_EXPECTS = "the 'UCI HAR Dataset' folder or the official zip"
CONVERTERS = (Converter("uci-har", "uci_har.npz", _EXPECTS, convert_uci_har, source="uci-har"),)

SOURCE = Source(
    name="uci-har",
    title="Human Activity Recognition Using Smartphones (UCI-HAR) v1, UCI ML Repository "
          "dataset 240",
    homepage="https://archive.ics.uci.edu/dataset/240",
    licence="its README: cite Anguita et al., ESANN 2013; no commercial use (UCI's page "
            "is quoted as CC BY 4.0)",
    files=(Remote(
        "uci_har_dataset.zip",
        ("https://archive.ics.uci.edu/static/public/240/"
         "human+activity+recognition+using+smartphones.zip",),
        sha256="c00b803081a5c797cd5e4b83700a9810b38d53d9d84e01917e090e1fdbc81031",
        size=61005872),),
    prepare=("uci-har",),
)
