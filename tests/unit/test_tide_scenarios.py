"""The TIDE ablation scenarios differ from the TIDE setup only in their components.

(Every scenario file is loaded and built by tests/unit/test_scenarios.py.)
"""

from __future__ import annotations

from raymm.app.build import load_scenario
from raymm.protocol.registry import policy_params

from helpers import REPO, load_script
from needs import full_data


def _generator():
    return load_script(REPO / "experiments" / "tide" / "tide_ablations.py")


def test_ablation_files_are_what_the_generator_writes(capsys) -> None:
    gen = _generator()
    assert gen.main(["--check"]) == 0, capsys.readouterr().out + \
        "run: python experiments/tide/tide_ablations.py"
    assert len(gen.rendered()) == 15

def test_tide_ablation_rows_differ_only_in_their_components() -> None:
    full_data("uci_har_hapt_raw_windows.npz")
    rows = REPO / "experiments" / "tide" / "ablations"
    base = load_scenario(REPO / "scenarios" / "tide_har.yaml").to_dict()
    core = load_scenario(rows / "01_core.yaml").to_dict()
    tide = load_scenario(rows / "07_tide.yaml").to_dict()
    for key in ("dataset", "population", "eval", "seed"):
        assert core[key] == base[key] == tide[key]
    assert {k: v for k, v in tide.items() if k != "name"} == \
        {k: v for k, v in base.items() if k != "name"}
    assert core["training"]["upload"] == "all" and tide["training"]["upload"] == "held"
    assert core["objective"]["lambda_p"] == 0.0 and not core["model"]["aux_heads"]
    # pooled global metrics and per-device personal ones, the adapter on its own path
    assert base["eval"]["scope"] == "both" and base["population"]["local_test_fraction"] == 0.2
    for row in ("01_core", "07_tide"):
        sc = load_scenario(rows / f"{row}.yaml")
        assert policy_params(sc, "objective").adapter_path == "personal"
    joint_sc = load_scenario(rows / "15_adapter_joint.yaml")
    assert policy_params(joint_sc, "objective").adapter_path == "joint"
    joint = joint_sc.to_dict()
    assert {k: v for k, v in joint.items() if k not in ("name", "objective")} == \
        {k: v for k, v in base.items() if k not in ("name", "objective")}
