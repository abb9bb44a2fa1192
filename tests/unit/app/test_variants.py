"""One scenario under another method (raymm.app.variants): what `method_variant` keeps and
drops (K, the preset's protocol, the sync period, what the other method cannot take), and
which methods run on a scenario at all."""

from __future__ import annotations

import pytest

import policies
from raymm.app.build import load_scenario
from raymm.app.variants import method_scenarios, method_variant, per_method_overrides
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
                     for m in policies.METHODS if m not in ("tide", "bmsfed")]
    assert skipped == ["tide: method 'tide': aggregation 'tide' has no periodic form, so it "
                       "cannot sync every 2 rounds",
                       "bmsfed: aggregation.name: bmsfed balances two modalities; the dataset "
                       "has 3 sensors; objective.name: bmsfed balances two modalities; the "
                       "dataset has 3 sensors"]
    with pytest.raises(ScenarioError) as err:               # named explicitly: must be valid
        method_scenarios(path, ["fedadam", "tide"])
    assert "tide: method 'tide'" in str(err.value)
    with pytest.raises(ScenarioError, match="unknown method"):
        method_scenarios(path, ["fedadamw"])


def test_method_variant_drops_only_what_the_other_method_cannot_take() -> None:
    raw = read_yaml(SCENARIOS / "fedmchain_synthetic.yaml")
    raw["aggregation"] = {"clusters": 3}
    raw["objective"] = {"tau": 0.2}
    fedavg = method_variant(raw, "fedavg", policies.PRESETS, sync_every=1)
    assert "aggregation" not in fedavg and "objective" not in fedavg
    assert "sync_every" not in fedavg["training"] and fedavg["training"]["lr"] == 0.005
    assert fedavg["selection"]["name"] == "fraction"     # a named section stays
    wo_ra = method_variant(raw, "fedmchain_wo_ra", policies.PRESETS)
    assert wo_ra["aggregation"] == {"clusters": 3} and wo_ra["training"]["sync_every"] == 2
    wo_ssca = method_variant(raw, "fedmchain_wo_ssca", policies.PRESETS)
    assert "aggregation" not in wo_ssca and wo_ssca["objective"] == {"tau": 0.2}
    assert raw["aggregation"] == {"clusters": 3}         # input untouched


def test_method_variant_keeps_the_sync_period_for_every_method() -> None:
    raw = read_yaml(SCENARIOS / "fedmchain_synthetic.yaml")     # sync_every: 2
    fedavg = method_variant(raw, "fedavg", policies.PRESETS)
    assert fedavg["training"]["exchange"] == "delta" and fedavg["training"]["sync_every"] == 2
    assert fedavg["aggregation"] == {"name": "delta_mean"}
    scaffold = method_variant(raw, "scaffold", policies.PRESETS)
    assert scaffold["aggregation"] == {"name": "scaffold_delta"}
    assert "sync_every" not in method_variant(raw, "local", policies.PRESETS)["training"]
    assert method_variant(raw, "fedmchain", policies.PRESETS, sync_every=7)[
        "training"]["sync_every"] == 7
    for method in ("fedavg", "fedprox", "scaffold", "local", "fedmchain"):
        load_scenario(method_variant(raw, method, policies.PRESETS))   # each one is valid


def test_a_policy_parameter_set_for_another_policy_is_named_not_dropped_in_silence() -> None:
    path = SCENARIOS / "fedmchain_synthetic.yaml"           # FedMChain: SSCA, MCFT
    _, notes = method_scenarios(path, ["fedmchain", "fedavg"], ["objective.lambda_a=0.2"])
    assert notes == ["fedavg: --set objective.lambda_a does not apply: the scenario's objective "
                     "policy is not this method's (ce); add --set objective.name=ce to set it "
                     "on ce"]
    # named, the section is the method's own and the value reaches its run
    variants, notes = method_scenarios(path, ["fedprox"], ["objective.name=ce",
                                                           "objective.mu=0.5"])
    assert notes == [] and variants[0]["objective"] == {"name": "ce", "mu": 0.5}
    # the section's own keys (selection.k) travel to every method
    _, notes = method_scenarios(path, ["fedavg"], ["selection.k=3"])
    assert notes == []


def test_per_method_overrides_group_by_method_and_refuse_a_bad_item() -> None:
    assert per_method_overrides(["a:model.fusion=attention", "b:x.y=1", "a:k=2"]) == {
        "a": ["model.fusion=attention", "k=2"], "b": ["x.y=1"]}
    with pytest.raises(ScenarioError, match="METHOD:KEY=VALUE"):
        per_method_overrides(["model.fusion=attention"])
