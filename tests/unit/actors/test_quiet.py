"""actors/quiet.py patches two of Ray's private internals. On a Ray that lacks them (simulated
here by removing or reshaping the attributes), each patch is skipped with one warning line and
Ray keeps its own behaviour; no Ray is started."""

from __future__ import annotations

import os

import pytest
import ray
import ray._private.ray_constants as ray_constants
import ray._private.worker as ray_worker

from actors import quiet

SWITCH = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    """Each test sees the warning as a new process would, and leaves Ray as it found it."""
    monkeypatch.setattr(quiet, "_warned", False)
    monkeypatch.setattr(ray_worker, "print_to_stdstream", ray_worker.print_to_stdstream)
    monkeypatch.delenv("RAYMM_VERBOSE", raising=False)
    monkeypatch.delenv(SWITCH, raising=False)


def test_on_the_tested_ray_both_patches_apply(capsys):
    # Ray's own hook, also when an earlier test in this process already patched it
    current = ray_worker.print_to_stdstream
    original = getattr(current, "__wrapped__", current)
    quiet.quiet_ray()
    assert ray_worker.print_to_stdstream is not original
    assert ray_worker.print_to_stdstream.__wrapped__ is original
    with quiet.loopback_only():
        assert ray_constants.ENABLE_RAY_CLUSTER is False and os.environ[SWITCH] == "0"
    assert ray_constants.ENABLE_RAY_CLUSTER is True and SWITCH not in os.environ
    assert capsys.readouterr().err == ""


def test_a_missing_print_hook_skips_the_patch_with_one_line(monkeypatch, capsys):
    monkeypatch.delattr(ray_worker, "print_to_stdstream")
    quiet.quiet_ray()
    quiet.quiet_ray()                                           # a second start: still one line
    assert not hasattr(ray_worker, "print_to_stdstream")       # nothing put in its place
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "print_to_stdstream" in err[0]
    assert f"Ray {ray.__version__} " in err[0] and "Ray's own output" in err[0]


def test_a_reshaped_print_hook_is_left_alone(monkeypatch, capsys):
    def other(data, ignore_prefix, extra):  # a later Ray with another signature
        return None

    monkeypatch.setattr(ray_worker, "print_to_stdstream", other)
    quiet.quiet_ray()
    assert ray_worker.print_to_stdstream is other
    assert len(capsys.readouterr().err.splitlines()) == 1


def test_a_missing_cluster_switch_leaves_ray_to_pick_its_addresses(monkeypatch, capsys):
    monkeypatch.delattr(ray_constants, "ENABLE_RAY_CLUSTER")
    with quiet.loopback_only():
        assert SWITCH not in os.environ                        # nothing half-applied
    assert SWITCH not in os.environ
    quiet.quiet_ray()                                           # this one still applies
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "ENABLE_RAY_CLUSTER" in err[0]
