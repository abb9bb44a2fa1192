"""`raymm data`: list datasets, prepare official releases, download public ones.

Wiring in `raymm/app/cli.py`: `add_data_parser(sub)` in `build_parser`, and
`if args.command == "data": return run_data(args)` in `main`. User mistakes raise
`RaymmError`/`DataError`, which `cli.main` prints as one line with exit code 2.
"""

from __future__ import annotations

import argparse
import importlib
import os
from pathlib import Path
from typing import Any

from pydantic import ValidationError

# Converter options: (flag, argparse kwargs); the help text names the converters a flag applies
# to. Defaults are None so only flags the user gave reach the converter (and a flag it does not
# take is an error).
_AV = "crema-d, ave"
_OPTIONS: list[tuple[str, dict[str, Any]]] = [
    ("--sample-rate", {"type": int, "help": f"audio rate in Hz after resampling ({_AV}; 16000)"}),
    ("--seconds", {"type": float, "help": f"fixed audio length ({_AV}; 3.0 / 5.0)"}),
    ("--n-mels", {"type": int, "help": f"mel bands ({_AV}; 40)"}),
    ("--hop-ms", {"type": float, "help": f"spectrogram hop in ms ({_AV}; 10)"}),
    ("--image-size", {"type": int, "help": f"frame side in pixels ({_AV}; 64)"}),
    ("--rgb", {"action": "store_true", "default": None,
               "help": f"keep colour frames [3, H, W] instead of grey [H, W] ({_AV})"}),
    ("--test-fraction", {"type": float,
                         "help": f"share of actors/videos held out for test ({_AV}; 0.2)"}),
    ("--skip-missing", {"action": "store_true", "default": None,
                        "help": f"drop clips lacking audio or frames instead of failing ({_AV})"}),
    ("--classes", {"type": int, "choices": [2, 3, 7],
                   "help": "cmu-mosei: 2 (sentiment >= 0 is positive), 3 (negative, neutral, "
                           "positive: the rounded score clipped to [-1, 1]) or 7 (rounded score)"}),
    ("--keep-time", {"action": "store_true", "default": None,
                     "help": "cmu-mosei: keep [T, d] features instead of the mean over time"}),
]


#: device traces `raymm data prepare` converts into raymm's trace table (docs/time.md):
#: name -> (trace format, default input under $RAYMM_DATA or None, default output)
TRACE_CONVERTERS: dict[str, tuple[str, str | None, str]] = {
    "flash-trace": ("flash", "flash_state_traces.json", "traces/flash.parquet"),
    "fedscale-trace": ("fedscale", None, "traces/fedscale.parquet"),
}


class _LazyNames:
    """Choices read from a registry only when argparse checks or shows them: importing the
    registries imports torch, which `raymm --help` must not wait for."""

    def __init__(self, module: str, attr: str, extra: tuple[str, ...] = ()) -> None:
        self.module, self.attr, self.extra = module, attr, extra

    def _names(self) -> list[str]:
        return sorted([*getattr(importlib.import_module(self.module), self.attr), *self.extra])

    def __contains__(self, item: object) -> bool:
        return item in self._names()

    def __iter__(self) -> Any:
        return iter(self._names())


def add_data_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the `data` command (with `list`, `prepare`, `download`) to `raymm`'s subparsers."""
    data = subparsers.add_parser("data", help="list, prepare and download datasets",
                                 description=__doc__.split("\n")[0])
    sub = data.add_subparsers(dest="data_command")
    ls = sub.add_parser("list", help="datasets, where each is expected, and whether it is there")
    ls.add_argument("--plugin", dest="plugins", action="append", default=[], metavar="MODULE",
                    help="import this Python module first, to list the datasets it registers "
                         "(repeatable; see raymm plugins list)")
    prep = sub.add_parser("prepare", help="convert an official release into raymm's .npz")
    prep.add_argument("name", choices=_LazyNames("raymm.data.releases", "CONVERTERS",
                                                 tuple(TRACE_CONVERTERS)),
                      metavar="NAME", help="converter: %(choices)s")
    prep.add_argument("--from", dest="src", default=None, metavar="PATH",
                      help="the release: a folder, zip or pickle (see docs/data.md); default: "
                           "where `raymm data download` puts it under $RAYMM_DATA")
    prep.add_argument("--out", default=None, metavar="FILE",
                      help="output .npz (default: the dataset's file under $RAYMM_DATA)")
    prep.add_argument("--force", action="store_true", help="replace an existing output")
    prep.add_argument("--capacity", default=None, metavar="PATH",
                      help="fedscale-trace: FedScale's client_device_capacity pickle (speed "
                           "and bandwidth per client)")
    prep.add_argument("--no-progress", action="store_true", help="no progress bar")
    for flag, kwargs in _OPTIONS:
        prep.add_argument(flag, **kwargs)
    dl = sub.add_parser("download", help="fetch a public release from its official source and "
                                         "verify its checksums")
    dl.add_argument("name", choices=_LazyNames("raymm.data.releases", "SOURCES"),
                    metavar="NAME", help="public release: %(choices)s")
    dl.add_argument("--out", default=None, metavar="DIR", help="folder (default: $RAYMM_DATA)")
    dl.add_argument("--sha256", default=None,
                    help="expected SHA-256 of a one-file release (replaces the pinned one)")
    dl.add_argument("--url", default=None,
                    help="fetch from this mirror instead: the file's URL, or a folder URL ending "
                         "in / that holds the release's files under their official names")
    dl.add_argument("--force", action="store_true", help="download again if the file exists")
    dl.add_argument("--no-progress", action="store_true", help="no progress bar")
    return data


def run_data(args: argparse.Namespace) -> int:
    """Run `raymm data ...`; returns the exit code (errors raise, see the module docstring)."""
    command = getattr(args, "data_command", None) or "list"
    if command == "prepare":
        return _prepare(args)
    if command == "download":
        return _download(args)
    # deferred: `raymm data list` answers without loading every loader's dependencies
    from raymm.app.plugins import load

    load(getattr(args, "plugins", []))
    print(list_text())
    return 0


def _progress(args: argparse.Namespace) -> bool:
    return not args.no_progress and not os.environ.get("RAYMM_NO_PROGRESS")


def expected_files(loader: Any) -> list[Path] | None:
    """The files a loader reads with its default params (`required_files(Params())`), or None
    when it cannot say. An empty list means the data is built in or generated.
    """
    try:
        params = loader.Params()
    except ValidationError:  # a required field without default: no default file either
        return None
    return list(loader.required_files(params))


def list_text() -> str:
    # deferred: `raymm data list` answers without loading every loader's dependencies
    from raymm.app.plugins import origin
    from raymm.data import DATASETS, resolve_data_path
    from raymm.data.base import data_root
    from raymm.data.releases import CONVERTERS, SOURCES

    root = os.environ.get("RAYMM_DATA")
    lines = [f"RAYMM_DATA={root}" if root else
             f"RAYMM_DATA is not set: relative paths resolve under {data_root().resolve()}",
             "datasets (scenario `dataset: {name: ...}`):"]
    width = max(map(len, [*DATASETS, *CONVERTERS]))
    for name in sorted(DATASETS):
        files = expected_files(DATASETS[name])
        if files is None:
            state = "needs a path in the scenario"
        elif not files:
            state = "built in / generated"
        else:
            missing = [p for p in files if not p.exists()]
            state = f"{'missing' if missing else 'present'}  {', '.join(map(str, files))}"
        plugin = origin("dataset", name)
        lines.append(f"  {name:<{width}}  {state}" + (f"  (plugin {plugin})" if plugin else ""))
    lines.append("releases (raymm data prepare NAME [--from PATH] [--out FILE]):")
    for name in sorted(CONVERTERS):
        conv = CONVERTERS[name]
        out = resolve_data_path(conv.default_file)
        if conv.source:
            src = SOURCES[conv.source]
            rel = src.release_path(data_root())
            how = (f"release {'downloaded' if src.downloaded(data_root()) else 'not downloaded'}"
                   f": {rel}; raymm data download {conv.source}")
        else:
            how = f"--from {conv.expects}"
        lines.append(f"  {name:<{width}}  {'present' if out.exists() else 'missing'}  {out}"
                     f"  ({how})")
    return "\n".join(lines)


def _prepare(args: argparse.Namespace) -> int:
    # deferred: `raymm data list` answers without loading every loader's dependencies
    from raymm.data.prepare import prepare

    if args.name in TRACE_CONVERTERS:
        return _prepare_trace(args)
    names = (flag.lstrip("-").replace("-", "_") for flag, _ in _OPTIONS)
    options = {k: v for k in names if (v := getattr(args, k)) is not None}
    res = prepare(args.name, args.src, args.out, force=args.force, progress=_progress(args),
                  **options)
    sizes = ", ".join(f"{sp} {n}" for sp, n in res.sizes.items())
    shapes = ", ".join(f"{m} {list(s)}" for m, s in res.shapes.items())
    print(f"prepared {args.name}: {res.path} ({sizes}; {shapes}; "
          f"{len(res.class_names)} classes)")
    if res.differs == ():
        print("reference: every array equals the file the shipped results were made with "
              "(pinned SHA-256 of each array)")
    elif res.differs:
        print(f"reference: differs from the file the shipped results were made with in "
              f"{', '.join(res.differs)}: this is not the same release")
    return 0


def _prepare_trace(args: argparse.Namespace) -> int:
    """`raymm data prepare flash-trace|fedscale-trace`: a device trace as raymm's table."""
    # deferred: `raymm data list` answers without loading every loader's dependencies
    from raymm.data.base import resolve_data_path
    from raymm.errors import RaymmError
    from raymm.population.traces import load_trace, write_raymm

    kind, default_src, default_out = TRACE_CONVERTERS[args.name]
    src = args.src or default_src
    if src is None:
        raise RaymmError(f"{args.name}: give the trace with --from PATH (FedScale's "
                         "client_behave_trace pickle)")
    if args.capacity is not None and kind != "fedscale":
        raise RaymmError(f"{args.name}: --capacity is for fedscale-trace only")
    out = resolve_data_path(args.out or default_out)
    if out.suffix.lower() not in (".parquet", ".pq", ".csv"):
        raise RaymmError(f"--out {out}: a trace table ends in .parquet or .csv")
    if out.exists() and not args.force:
        raise RaymmError(f"{out} exists; --force replaces it")
    trace = load_trace(kind, resolve_data_path(src),
                       None if args.capacity is None else resolve_data_path(args.capacity))
    write_raymm(trace, out)
    share = sorted(trace.online_share().tolist())
    print(f"prepared {args.name}: {out} ({trace.entries} devices, {trace.starts.shape[0]} "
          f"intervals; median share of its window available {share[len(share) // 2]:.3f})")
    return 0


def _download(args: argparse.Namespace) -> int:
    # deferred: `raymm data list` answers without loading every loader's dependencies
    from raymm.data.base import data_root
    from raymm.data.download import download

    res = download(args.name, args.out, url=args.url, sha256=args.sha256, force=args.force,
                   progress=_progress(args))
    for f in res.files:
        verb = "already present" if f.already else "downloaded"
        print(f"{verb}: {f.path} ({f.size / 2**20:.1f} MiB)")
        if f.verified == "sha256":
            check = "verified: the pinned SHA-256"
        elif f.verified == "contents":
            n = res.source.contents.count if res.source.contents else 0
            check = f"verified: the {n} files it must contain match their pinned SHA-256s"
        else:
            check = "not verified: no checksum known (pin it with --sha256)"
        print(f"  sha256 {f.sha256} ({check})")
        if f.note:
            print(f"  note: {f.note}")
    print(f"licence: {res.source.licence} (docs/data.md)")
    default = res.source.release_path(data_root())
    where = "" if res.path.resolve() == default.resolve() else f" --from {res.path}"
    for conv in res.source.prepare:
        print(f"next: raymm data prepare {conv}{where}")
    return 0
