"""Every scenario file in the repository (found recursively) loads and validates."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from raymm.api import load_scenario
from raymm.config import read_yaml

SCENARIOS = sorted(Path(__file__).resolve().parents[2].joinpath("scenarios").rglob("*.yaml"))


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.name)
def test_scenario_validates(path: Path) -> None:
    if read_yaml(path).get("dataset", {}).get("name") == "har" and \
            not os.environ.get("RAYMM_DATA"):
        pytest.skip("needs RAYMM_DATA for the HAR file")
    sc = load_scenario(path)
    assert sc.name


def test_tide_ablation_rows_differ_only_in_their_components() -> None:
    if not os.environ.get("RAYMM_DATA"):
        pytest.skip("needs RAYMM_DATA for the HAR file")
    root = Path(__file__).resolve().parents[2] / "scenarios"
    base = load_scenario(root / "tide_har.yaml").to_dict()
    core = load_scenario(root / "tide_ablations" / "01_core.yaml").to_dict()
    tide = load_scenario(root / "tide_ablations" / "07_tide.yaml").to_dict()
    for key in ("dataset", "population", "eval", "seed"):
        assert core[key] == base[key] == tide[key]
    assert {k: v for k, v in tide.items() if k != "name"} == \
        {k: v for k, v in base.items() if k != "name"}
    assert core["training"]["upload"] == "all" and tide["training"]["upload"] == "held"
    assert core["objective"]["lambda_p"] == 0.0 and not core["model"]["aux_heads"]
