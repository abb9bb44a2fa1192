"""Building a run from a scenario (raymm.app.build): a scenario file is read as YAML, with
overrides, and a file that is not YAML is one clear error."""

import pytest

from raymm.app.build import load_scenario
from raymm.errors import ScenarioError


def test_load_scenario_reads_yaml(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text("name: x\nrounds: 2\n")
    sc = load_scenario(p, ["seed=4"])
    assert (sc.name, sc.rounds, sc.seed) == ("x", 2, 4)
    p.write_text("name: [unclosed\n")
    with pytest.raises(ScenarioError, match="not valid YAML"):
        load_scenario(p)
