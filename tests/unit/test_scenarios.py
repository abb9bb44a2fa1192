"""Every scenario file in the repository (found recursively) validates and builds."""

import os

import pytest

from raymm.api import build_world, load_scenario

from helpers import REPO

SCENARIOS = sorted((REPO / "scenarios").rglob("*.yaml"))
NEEDS_DATA = {"har"}


def test_scenarios_exist():
    assert len(SCENARIOS) >= 3


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: str(p.relative_to(REPO)))
def test_scenario_validates_and_builds(path, monkeypatch):
    import yaml

    raw = yaml.safe_load(path.read_text())
    if raw.get("dataset", {}).get("name") in NEEDS_DATA and not os.environ.get("RAYMM_DATA"):
        pytest.skip("RAYMM_DATA is not set; this scenario reads a real data file")
    sc = load_scenario(path)
    assert sc.name and sc.rounds >= 1
    world = build_world(sc)
    assert world.population.n == sc.population.devices
    assert world.population.num_samples.min() >= 1
