"""What Ray prints, and where it listens, when raymm starts it: quiet, and on loopback.

A normal `raymm run` prints raymm's own lines only; `raymm run -v` (RAYMM_VERBOSE=1) shows
Ray's warnings and log lines too, always on stderr (never among the result lines on stdout).
Ray's own log files stay in its session folder (/tmp/ray/session_latest/logs) either way.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


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
    # deferred: Ray's private modules, looked up only where they are patched
    import ray._private.worker as ray_worker

    if not verbose():
        os.environ.setdefault("RAY_IGNORE_UNHANDLED_ERRORS", "1")
    original = getattr(ray_worker.print_to_stdstream, "__wrapped__", ray_worker.print_to_stdstream)

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
    address, so the switch is put back (a later connection to a cluster needs the real one)."""
    # deferred: Ray's private modules, looked up only where they are patched
    from ray._private import ray_constants

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
