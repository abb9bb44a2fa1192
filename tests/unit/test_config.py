import pytest

import policies
from raymm.app.build import load_scenario
from raymm.app.validate import check_scenario
from raymm.config.schema import apply_overrides
from raymm.errors import ScenarioError

from helpers import tiny_scenario


def problems_of(raw):
    with pytest.raises(ScenarioError) as info:
        check_scenario(raw, policies.PRESETS)
    return info.value.problems


def test_valid_tiny_scenario():
    sc = check_scenario(tiny_scenario(), policies.PRESETS)
    assert sc.selection.k == 5 and sc.aggregation.name == "fedavg"


def test_unknown_key_is_named():
    assert problems_of(tiny_scenario(**{"training.lr_typo": 0.1})) == [
        "training.lr_typo: unknown key"]


def test_unknown_policy_lists_choices():
    (msg,) = problems_of(tiny_scenario(**{"selection.name": "nope"}))
    assert msg.startswith("selection.name: unknown selection policy 'nope'")
    assert "random" in msg and "all_online" in msg


def test_unknown_policy_param():
    assert problems_of(tiny_scenario(**{"objective.muu": 0.1})) == ["objective.muu: unknown key"]


def test_k_larger_than_devices():
    (msg,) = problems_of(tiny_scenario(**{"selection.k": 13}))
    assert "selection.k" in msg and "13" in msg and "12" in msg


def test_sensor_the_dataset_lacks():
    raw = tiny_scenario()
    raw["population"]["tiers"][1]["sensors"] = ["gyro"]
    (msg,) = problems_of(raw)
    assert msg.startswith("population.tiers.1.sensors: 'gyro' not in dataset")
    assert "a, b" in msg


def test_d_greater_than_D():
    raw = tiny_scenario()
    raw["population"]["availability"][1]["online"] = 9
    (msg,) = problems_of(raw)
    assert "population.availability.1" in msg and "d=9" in msg and "D=3" in msg


def test_missing_data_file(tmp_path, monkeypatch):
    monkeypatch.setenv("RAYMM_DATA", str(tmp_path))
    raw = tiny_scenario(dataset={"name": "har", "path": "nothere.npz"})
    raw["population"]["tiers"] = None
    (msg,) = problems_of(raw)
    assert msg.startswith("dataset.path: data file not found") and "nothere.npz" in msg


def test_every_problem_reported_at_once():
    raw = tiny_scenario(**{"selection.name": "nope", "selection.k": 50, "rounds": -1,
                           "model.bogus": 1})
    msgs = problems_of(raw)
    assert [m.split(":")[0] for m in msgs] == ["rounds", "model.bogus", "selection.name",
                                               "selection.k"]


def test_unknown_method_and_dataset():
    (msg,) = problems_of(tiny_scenario(method="fedsomething"))
    assert "fedavg" in msg and "fedprox" in msg
    (msg,) = problems_of(tiny_scenario(dataset={"name": "mnist9"}))
    assert msg.startswith("dataset.name: unknown dataset 'mnist9'") and "synthetic" in msg


def test_preset_is_overridden_by_scenario():
    sc = check_scenario(tiny_scenario(method="fedprox", objective={"name": "ce", "mu": 0.5}),
                        policies.PRESETS)
    assert sc.objective.params() == {"mu": 0.5}
    sc = check_scenario(tiny_scenario(method="fedprox"), policies.PRESETS)
    assert sc.objective.params() == {"mu": 0.01}


def test_overrides_do_not_mutate_and_parse_types():
    raw = tiny_scenario()
    out = apply_overrides(raw, ["rounds=9", "training.lr=0.5", "selection.name=all_online",
                                "execution.devices_per_actor=auto"])
    assert raw["rounds"] == 3 and out["rounds"] == 9 and out["training"]["lr"] == 0.5
    assert out["execution"]["devices_per_actor"] == "auto"


def test_load_scenario_reads_yaml(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text("name: x\nrounds: 2\n")
    sc = load_scenario(p, ["seed=4"])
    assert (sc.name, sc.rounds, sc.seed) == ("x", 2, 4)
    p.write_text("name: [unclosed\n")
    with pytest.raises(ScenarioError, match="not valid YAML"):
        load_scenario(p)


def test_default_k_larger_than_population_is_rejected():
    """No selection section means K = the schema's default (10), which 5 devices cannot hold."""
    assert problems_of({"name": "x", "rounds": 1, "population": {"devices": 5}}) == [
        "selection.k: K=10 is larger than population.devices=5"]
    assert problems_of({"name": "x", "rounds": 1, "selection": {"k": 30}}) == [
        "selection.k: K=30 is larger than population.devices=20"]


def test_validation_matches_aggregator_to_exchange():
    (msg,) = problems_of(tiny_scenario(**{"training.exchange": "delta"}))
    assert msg.startswith("aggregation.name: 'fedavg' averages parameters")
    (msg,) = problems_of(tiny_scenario(**{"aggregation.name": "delta_mean"}))
    assert msg == "aggregation.name: 'delta_mean' needs deltas; set training.exchange: delta"
