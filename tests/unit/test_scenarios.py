"""Every scenario file in the repository (found recursively: the user scenarios, the experiments'
configurations and the tools' stress populations) validates and builds."""

import pytest

from raymm.app.build import build_world, load_scenario

from helpers import REPO
from needs import dataset_files
from tiny_releases import STANDIN, write_standin

SCENARIOS = sorted(p for folder in ("scenarios", "experiments", "tools")
                   for p in (REPO / folder).rglob("*.yaml"))
#: releases only their users hold (`raymm data prepare`): the scenario loads and builds on a
#: stand-in file in the prepared layout at the release's real shapes, in place of the release
RELEASES = set(STANDIN)


def test_scenarios_exist():
    assert len(SCENARIOS) >= 3


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: str(p.relative_to(REPO)))
def test_scenario_validates_and_builds(path, monkeypatch, tmp_path):
    import yaml

    raw = yaml.safe_load(path.read_text())
    dataset = raw.get("dataset", {})
    dataset_files(dataset)
    if dataset.get("name") in RELEASES:
        monkeypatch.setenv("RAYMM_DATA", str(tmp_path))
        pop = raw["population"]
        need = pop["devices"] * pop.get("partition", {}).get("min_samples", 2)
        write_standin(dataset["name"], tmp_path / dataset["path"], n_train=max(300, 2 * need),
                      n_test=60, classes=dataset.get("classes"))
    overrides = []
    if dataset.get("name") == "synthetic_mmap":
        # generated on first load: here a few MiB of it, not the scenario's gigabytes
        monkeypatch.setenv("RAYMM_DATA", str(tmp_path))
        clients = dataset.get("clients", 100)
        overrides = [f"dataset.n_train={2 * clients}", "dataset.n_test=50"]
    sc = load_scenario(path, overrides)
    assert sc.name and sc.rounds >= 1
    world = build_world(sc)
    assert world.population.n == sc.population.devices
    assert world.population.num_samples.min() >= 1
