"""`raymm.phases`: named regions, timed by an open clock and seen by torch's profiler."""

import pytest
import torch

from raymm.phases import PhaseClock, phase, recorded


def test_a_clock_sums_seconds_and_calls_per_name_and_nested_phases_count_in_both():
    @phase("outer")
    def outer(n: int) -> int:
        for _ in range(n):
            with phase("inner"):
                pass
        return n

    assert outer(2) == 2   # no clock open: the function runs as it is
    with PhaseClock() as clock:
        assert outer(3) == 3
        outer(1)
    assert clock.calls == {"outer": 2, "inner": 4}
    assert clock.seconds["outer"] >= clock.seconds["inner"] > 0
    outer(5)               # closed: nothing more is counted
    assert clock.calls == {"outer": 2, "inner": 4}
    clock.reset()
    assert clock.seconds == clock.calls == {}


def test_one_clock_at_a_time():
    with PhaseClock(), pytest.raises(RuntimeError, match="already open"):
        PhaseClock().__enter__()
    with PhaseClock() as again:   # the first one closed on the error
        with phase("x"):
            pass
    assert again.calls == {"x": 1}


def test_a_phase_that_raises_is_still_timed():
    with PhaseClock() as clock:
        with pytest.raises(ValueError), phase("failing"):
            raise ValueError("no")
    assert clock.calls == {"failing": 1}


def test_recorded_phases_are_profiler_ranges_by_name():
    @phase("my.step")
    def step() -> torch.Tensor:
        return torch.ones(3) * 2

    with torch.profiler.profile() as prof:
        step()
    assert "my.step" not in {e.key for e in prof.key_averages()}
    with recorded(), torch.profiler.profile() as prof:
        step()
    assert "my.step" in {e.key for e in prof.key_averages()}
