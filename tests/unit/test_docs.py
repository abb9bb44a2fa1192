"""docs/scenario.md is generated from the schema; it must match what the code says now."""

from raymm.schema_doc import render

from helpers import REPO


def test_scenario_reference_is_current():
    committed = (REPO / "docs" / "scenario.md").read_text()
    assert committed == render(), "run: python -m raymm.schema_doc > docs/scenario.md"


def test_reference_covers_every_section_and_policy():
    text = render()
    for key in ("population.availability[].period", "execution.actor.num_gpus",
                "faults.deadline_seconds", "training.upload", "objective: {name: ce}",
                "selection: {name: random}", "aggregation: {name: fedavg}"):
        assert key in text, key
