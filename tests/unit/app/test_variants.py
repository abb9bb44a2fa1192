"""One scenario under every method: what `method_variant` keeps (K, the preset's protocol, the
sync period), and `raymm sweep --methods`."""

from __future__ import annotations

from pathlib import Path

import pytest

import policies
from raymm.app.build import load_scenario
from raymm.app.cli import main
from raymm.app.variants import method_scenarios, method_variant
from raymm.config.schema import read_yaml
from raymm.errors import ScenarioError

from helpers import REPO, tiny_scenario
from needs import full_data

SCENARIOS = REPO / "scenarios"


def test_a_nameless_selection_keeps_its_k_and_the_preset_protocol_stays() -> None:
    raw = {"name": "x", "rounds": 5, "method": "tide", "selection": {"k": 7},
           "training": {"local_epochs": 3}}
    v = method_variant(raw, "fedavg", policies.PRESETS)
    assert v["selection"] == {"k": 7}                    # tide's selection dropped, K kept
    # the TIDE preset's Adam 1e-3 and its evaluation protocol carry over
    assert v["training"] == {"local_epochs": 3, "optimizer": "adam", "lr": 1e-3}
    assert v["eval"] == {"every": 10, "early_stop_patience": 10}
    assert raw["selection"] == {"k": 7} and "eval" not in raw     # input untouched
    # a key the other method's preset sets is its own
    ours = method_variant({**raw, "method": "fedavg"}, "tide", policies.PRESETS)
    assert "lr" not in ours["training"]


def test_fedavg_variant_of_tide_har_is_the_shipped_fedavg_scenario() -> None:
    full_data("uci_har_hapt_raw_windows.npz")
    v = method_variant(read_yaml(SCENARIOS / "tide_har.yaml"), "fedavg", policies.PRESETS)
    a = load_scenario(v).to_dict()
    b = load_scenario(SCENARIOS / "tide_har_fedavg.yaml").to_dict()
    a["name"] = b["name"]
    assert a == b


def test_methods_without_a_global_model_are_evaluated_per_device() -> None:
    raw = tiny_scenario(**{"method": "fedavg", "eval.scope": "both",
                           "population.local_test_fraction": 0.2})
    for m in ("fedproto", "local"):
        assert method_variant(raw, m, policies.PRESETS)["eval"]["scope"] == "devices"
    assert method_variant(raw, "fedadam", policies.PRESETS)["eval"]["scope"] == "both"


def test_periodic_twins_of_the_new_methods_keep_their_parameters() -> None:
    presets = dict(policies.PRESETS)
    presets["fedadam_slow"] = {**presets["fedadam"],
                               "aggregation": {"name": "fedadam", "eta": 0.001}}
    raw = tiny_scenario(**{"training.sync_every": 3, "training.exchange": "delta"})
    v = method_variant(raw, "fedadam_slow", presets)
    assert v["aggregation"] == {"name": "fedadam_delta", "eta": 0.001}
    assert v["training"]["exchange"] == "delta" and v["training"]["sync_every"] == 3
    for m, twin in (("fedyogi", "fedyogi_delta"), ("fedadagrad", "fedadagrad_delta"),
                    ("harmony", "harmony_delta")):
        assert method_variant(raw, m, policies.PRESETS)["aggregation"]["name"] == twin
    proto = method_variant(raw, "fedproto", policies.PRESETS)
    # the scenario's own exchange (delta) is FedAvg's, not FedProto's (personal, the preset)
    assert proto["training"]["sync_every"] == 3 and "exchange" not in proto["training"]
    assert "exchange" not in method_variant(raw, "local", policies.PRESETS)["training"]
    for m in ("fedadam", "fedyogi", "fedadagrad", "harmony", "fedproto"):
        load_scenario(method_variant(raw, m, policies.PRESETS))


def test_all_methods_on_one_scenario_skips_what_cannot_run() -> None:
    path = SCENARIOS / "fedmchain_synthetic.yaml"           # υ = 2
    variants, skipped = method_scenarios(path, ["all"])
    names = [v["name"] for v in variants]
    assert names == [f"fedmchain_synthetic{'' if m == 'fedmchain' else '_' + m}"
                     for m in policies.METHODS if m != "tide"]
    assert skipped == ["tide: method 'tide': aggregation 'tide' has no periodic form, so it "
                       "cannot sync every 2 rounds"]
    with pytest.raises(ScenarioError) as err:               # named explicitly: must be valid
        method_scenarios(path, ["fedadam", "tide"])
    assert "tide: method 'tide'" in str(err.value)
    with pytest.raises(ScenarioError, match="unknown method"):
        method_scenarios(path, ["fedadamw"])


def test_sweep_cli_runs_every_method_on_a_scenario(tmp_path: Path, capsys) -> None:
    import yaml

    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(tiny_scenario(**{"rounds": 2, "eval.every": 1})))
    out = tmp_path / "sweep"
    code = main(["sweep", str(path), "--methods", "fedavg", "fedadam", "harmony",
                 "--seeds", "1", "2", "--out", str(out), "--budget-from", "tiny"])
    assert code == 0
    table = (out / "comparison.md").read_text()
    for name in ("| tiny | 2 |", "| tiny_fedadam | 2 |", "| tiny_harmony | 2 |"):
        assert name in table
    assert len(list((out / "runs").iterdir())) == 6
