"""Named phases of a round: regions that a profiler or a measurement tool reads by name.

The round's steps mark themselves with `phase(name)`, as a context or as a decorator::

    with phase("server.aggregate"):
        ...

    @phase("host.train.sequential")
    def train(self, ...): ...

A phase does next to nothing unless something in this process listens:

- a `PhaseClock` (one open at a time): each phase adds its wall seconds and one call under its
  name. Phases nest (the local update runs inside the host's training), so an outer phase's
  seconds include the inner ones'.
- `recorded()`: each phase is also a `torch.profiler.record_function` range, so a
  `torch.profiler.profile()` trace and its `key_averages()` show it by name. Off by default:
  an idle `record_function` costs more than the rest of a phase, and some phases are entered
  once per minibatch.

Both see this process only: on Ray, the hosts' phases run inside the DeviceActors.

Names are `<where>.<what>` (`server.plan`, `lockstep.program`); `tools/round_phases.py` lists
the ones it reports, and its test checks that each is entered in a run.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from time import perf_counter
from typing import ParamSpec, TypeVar

from torch.profiler import record_function

P = ParamSpec("P")
R = TypeVar("R")

#: the open clock, if any (`PhaseClock.__enter__`)
_clock: PhaseClock | None = None
#: how many `recorded()` blocks are open
_recording = 0


class PhaseClock:
    """Wall seconds and calls per phase name, summed over the phases entered in this process
    while the clock is open (`with PhaseClock() as clock:`). One clock at a time."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds
        self.calls[name] = self.calls.get(name, 0) + 1

    def reset(self) -> None:
        """Forget what was counted so far (a tool skipping its warm-up rounds)."""
        self.seconds, self.calls = {}, {}

    def __enter__(self) -> PhaseClock:
        global _clock
        if _clock is not None:
            raise RuntimeError("a PhaseClock is already open in this process")
        _clock = self
        return self

    def __exit__(self, *exc: object) -> None:
        global _clock
        _clock = None


@contextmanager
def recorded() -> Iterator[None]:
    """While open, every phase is also a `torch.profiler.record_function` range."""
    global _recording
    _recording += 1
    try:
        yield
    finally:
        _recording -= 1


class phase:  # noqa: N801 -- used like a function: `with phase("server.plan"):`
    """The region `name`: timed by an open `PhaseClock`, a profiler range under `recorded()`.
    As a decorator, every call of the function is the region."""

    __slots__ = ("name", "_start", "_range")

    def __init__(self, name: str) -> None:
        self.name = name
        self._start: float | None = None
        self._range: record_function | None = None

    def __enter__(self) -> phase:
        if _recording:
            self._range = record_function(self.name)
            self._range.__enter__()
        if _clock is not None:
            self._start = perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._start is not None:
            if _clock is not None:
                _clock.add(self.name, perf_counter() - self._start)
            self._start = None
        if self._range is not None:
            self._range.__exit__(None, None, None)
            self._range = None

    def __call__(self, fn: Callable[P, R]) -> Callable[P, R]:
        name = self.name

        @functools.wraps(fn)
        def inner(*args: P.args, **kwargs: P.kwargs) -> R:
            with phase(name):   # a region of its own per call: calls may nest or recurse
                return fn(*args, **kwargs)

        return inner
