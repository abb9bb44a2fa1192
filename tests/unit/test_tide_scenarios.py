"""The TIDE ablation scenarios differ from the TIDE setup only in their components.

(Every scenario file is loaded and built by tests/unit/test_scenarios.py.)
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from raymm.api import load_scenario

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
