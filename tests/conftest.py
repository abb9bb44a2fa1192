"""Shared fixtures: one small local Ray per test session, tiny scenarios; lock-step training
that falls back to the sequential path fails the test."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from needs import full_data

REPO = Path(__file__).resolve().parents[1]

#: `raymm.training.lockstep.fallback.STRICT_VAR` (not imported: that would load torch for every
#: test).
#: Set before any Ray starts, so the Ray workers a test starts inherit it: a lock-step program
#: that falls back raises wherever it runs, and a run stops on a round that counts one
STRICT_LOCKSTEP = "RAYMM_STRICT_LOCKSTEP"
os.environ[STRICT_LOCKSTEP] = "1"


@pytest.fixture(autouse=True)
def _lockstep_fallback(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A test marked `lockstep_fallback` expects a fallback: strict mode is off for it (in
    this process; a Ray already running keeps its workers' setting)."""
    if request.node.get_closest_marker("lockstep_fallback") is not None:
        monkeypatch.setenv(STRICT_LOCKSTEP, "0")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests marked `alone` run last: they stop every Ray on the machine (`ray down` runs
    `ray stop` on a head that is this machine); `make test` runs them in a pytest of their own
    after the others. Under pytest-xdist (`make test`: two workers, `--dist loadgroup`) the
    tests that use the session's Ray (`ray_session`) are one group, so one worker starts that
    Ray once and runs them all; the tests marked `cluster` are another, so two loopback
    clusters (a dozen processes each) never share the two cores at once."""
    items.sort(key=lambda item: item.get_closest_marker("alone") is not None)  # stable
    for item in items:
        if "ray_session" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("ray_session"))
        elif item.get_closest_marker("cluster") is not None:
            item.add_marker(pytest.mark.xdist_group("loopback_cluster"))


@pytest.fixture(scope="session")
def ray_session() -> Iterator[Any]:
    """A local Ray on 127.0.0.1 with fixed small resources, shared by the whole session."""
    import ray

    if ray.is_initialized():
        yield ray
        return
    # two fake GPUs: fractional-GPU packing is tested on them; CPU-only runs must not notice
    ray.init(address="local", num_cpus=2, num_gpus=2, include_dashboard=False,
             object_store_memory=200 * 1024**2, _node_ip_address="127.0.0.1",
             logging_level="WARNING", log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()


@pytest.fixture
def data_dir() -> Path:
    """The full-data folder `$RAYMM_DATA`: skipped with how to provide it when unset, a
    failure instead under RAYMM_REQUIRE_DATA=1 (CI), so CI cannot skip the full-data tests.
    A test that needs particular files calls `needs.full_data(*names)` itself."""
    return full_data()
