"""What Ray prints, and where it listens, when raymm starts it: quiet, and on loopback.

A normal `raymm run` prints raymm's own lines only; `raymm run -v` (RAYMM_VERBOSE=1) shows
Ray's warnings and log lines too, always on stderr (never among the result lines on stdout).
Ray's own log files stay in its session folder (/tmp/ray/session_latest/logs) either way.

Two of these touch Ray's private internals, as found in the Ray release line raymm pins
(`TESTED_RAY`; pyproject.toml bounds Ray to it): `ray._private.worker.print_to_stdstream` and
`ray._private.ray_constants.ENABLE_RAY_CLUSTER`. Each checks first that what it patches is there
in the shape it expects. On a Ray where it is not, the patch is skipped, one line on stderr
says so (once per process), and Ray behaves and prints as it does on its own: never a crash.
"""

from __future__ import annotations

import inspect
import logging
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

#: the Ray release line whose internals the patches below were written for and tested on
TESTED_RAY = "2.60"
_warned = False


def _skip_patch(missing: str) -> None:
    """Say once per process that a patch is skipped because Ray lacks `missing`."""
    global _warned
    if _warned:
        return
    _warned = True
    try:
        # deferred: Ray is only imported where it is used (the executor has imported it)
        import ray

        version = ray.__version__
    except ImportError:
        version = "(not importable)"
    print(f"raymm: Ray {version} has no {missing} (raymm quiets Ray {TESTED_RAY}.x); showing "
          "Ray's own output instead", file=sys.stderr)


def _takes(fn: Callable[..., Any], names: tuple[str, ...]) -> bool:
    """Whether `fn` takes exactly the positional parameters `names`."""
    try:
        return tuple(inspect.signature(fn).parameters) == names
    except (TypeError, ValueError):
        return False


def verbose() -> bool:
    return os.environ.get("RAYMM_VERBOSE", "") not in ("", "0")


def ray_logging_level() -> int:
    """For ray.init: Ray's token-authentication notice is a warning on every start."""
    return logging.WARNING if verbose() else logging.ERROR


def quiet_ray() -> None:
    """Before ray.init. A DeviceActor killed mid-round leaves results nobody fetches: Ray
    prints each as an "Unhandled error" block, although the executor has already counted it.
    Ray's driver prints the errors the raylet publishes (a worker died, ...) on stdout, among
    raymm's result lines: they go to stderr with -v and nowhere otherwise (the rounds table
    counts the faults, Ray's logs keep the details)."""
    if not verbose():
        os.environ.setdefault("RAY_IGNORE_UNHANDLED_ERRORS", "1")
    try:
        # deferred: Ray's private modules, looked up only where they are patched
        import ray._private.worker as ray_worker
    except ImportError:
        _skip_patch("ray._private.worker")
        return
    current = getattr(ray_worker, "print_to_stdstream", None)
    original = getattr(current, "__wrapped__", current)
    if not callable(original) or not _takes(original, ("data", "ignore_prefix")):
        _skip_patch("ray._private.worker.print_to_stdstream(data, ignore_prefix)")
        return

    def to_stderr(data: dict[str, Any], ignore_prefix: bool) -> None:
        if verbose():
            original({**data, "is_err": True}, ignore_prefix)

    to_stderr.__wrapped__ = original  # type: ignore[attr-defined]
    ray_worker.print_to_stdstream = to_stderr


@contextmanager
def loopback_only() -> Iterator[None]:
    """Around ray.init of an embedded Ray: it listens on 127.0.0.1 only. Ray turns a node
    address of 127.0.0.1 into the machine's outward address unless clusters are off for this
    host (its switch for macOS/Windows); its servers bind the node address. Ray's processes
    start inside the block and keep the setting; afterwards this process asks its node for the
    address, so the switch is put back (a later connection to a cluster needs the real one).
    On a Ray without that switch nothing is changed: Ray picks its addresses itself."""
    try:
        # deferred: Ray's private modules, looked up only where they are patched
        from ray._private import ray_constants
    except ImportError:
        ray_constants = None  # type: ignore[assignment]
    if not isinstance(getattr(ray_constants, "ENABLE_RAY_CLUSTER", None), bool):
        _skip_patch("ray._private.ray_constants.ENABLE_RAY_CLUSTER")
        yield
        return
    key = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
    env, const = os.environ.get(key), ray_constants.ENABLE_RAY_CLUSTER
    os.environ[key] = "0"  # Ray's child processes
    ray_constants.ENABLE_RAY_CLUSTER = False  # this process read it when it imported Ray
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = const
        if env is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = env


@contextmanager
def driver_stderr_captured() -> Iterator[None]:
    """Ray's C++ core worker in this process writes straight to file descriptor 2. Creating an
    actor that Ray may restart, with arguments in the object store (the executor keeps them
    alive for exactly that), logs an error-level line each time. Without -v those lines go to
    a temporary file that is dropped (Ray's driver log keeps them)."""
    if verbose():
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
