"""Whole-scenario validation (raymm.app.validate): every problem named at once (unknown keys,
policies, methods and datasets, K, sensors, availability, data files, presets, the exchange);
and `raymm validate` makes every check that building a run makes, before any data is
loaded: what a policy's `bind` refuses, the population's tier rules (one function for both)
and what the loaded data refuses."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from pydantic import ValidationError

import policies
from raymm.app.build import build_policies
from raymm.app.cli import main
from raymm.app.validate import check_scenario, merge_preset
from raymm.config.schema import PopulationSpec, Scenario, TierSpec
from raymm.data import dataset_sensors, load_dataset
from raymm.errors import ScenarioError
from raymm.population.devices import build_population, tier_problems
from raymm.protocol.registry import POLICY_SECTIONS, policy_params
from raymm.protocol.seams import Policy

from helpers import REPO, tiny_scenario

QUICKSTART = REPO / "scenarios" / "quickstart.yaml"


def validate_quickstart(capsys: pytest.CaptureFixture[str], *overrides: str) -> tuple[int, str]:
    rc = main(["validate", str(QUICKSTART), *(a for o in overrides for a in ("--set", o))])
    return rc, capsys.readouterr().err


def test_a_chain_naming_a_sensor_the_dataset_lacks_fails_validate(capsys):
    chain = ("schedule.name=modality_chain", "schedule.chain=[left, nose]")
    rc, err = validate_quickstart(capsys, *chain)
    assert rc == 2 and "schedule.chain: ['nose'] not among the dataset's sensors" in err, err
    # with the late fusion a chain needs, the missing sensor is the one mistake
    rc, err = validate_quickstart(capsys, *chain, "model.fusion=sum_logits")
    assert rc == 2 and err.count("\n  - ") == 1 and "'nose'" in err, err


def test_mcft_without_the_chain_schedule_fails_validate(capsys):
    """MCFT's bind refused it at build time only; validate said the scenario was valid."""
    rc, err = validate_quickstart(capsys, "objective.name=mcft")
    assert rc == 2 and "objective.name: mcft needs schedule modality_chain" in err, err


# --- every policy with a hook: what building refuses, validation refuses -------------------
# Each registered policy with a `bind` or `check_scenario` hook goes into its section of the
# tiny scenario, under every combination of the scenario facts those hooks read.
SCHEDULE_VARIANTS: list[dict[str, Any]] = [
    {"name": "joint"}, {"name": "harmony"}, {"name": "modality_chain"},
    {"name": "modality_chain", "chain": ["b", "nose"]},
    {"name": "modality_chain", "chain": ["b", "a"], "rounds": [1, 1]},
    {"name": "modality_chain", "order": "adaptive"},
    {"name": "modality_chain", "order": "adaptive", "probe_rounds": 1, "phases": 2},
]
FACTS: dict[str, list[Any]] = {"rounds": [1, 4], "model.fusion": ["concat", "sum_logits"],
                               "training.upload": ["all", "held"],
                               "model.aux_heads": [False, True]}


def own_hook(cls: type, hook: str) -> bool:
    """The policy class writes `hook` itself (every policy has it: `raymm.protocol.seams.Policy`'s
    default checks nothing and reads nothing)."""
    return getattr(cls, hook) is not getattr(Policy, hook)


def hooked() -> list[tuple[str, str]]:
    return [(section, name) for section, registry in POLICY_SECTIONS.items()
            for name in registry.names()
            if any(own_hook(registry.get(name), h) for h in ("bind", "check_scenario"))]


def cases(section: str, name: str) -> list[dict[str, Any]]:
    schedules = [s for s in SCHEDULE_VARIANTS if s["name"] == name] \
        if section == "schedule" else SCHEDULE_VARIANTS
    out = []
    for schedule, values in itertools.product(schedules, itertools.product(*FACTS.values())):
        raw = tiny_scenario(**dict(zip(FACTS, values)))
        raw["schedule"] = dict(schedule)
        raw[section] = {"name": name} if section != "schedule" else dict(schedule)
        out.append(raw)
    return out


def validates(raw: dict[str, Any]) -> bool:
    try:
        check_scenario(raw, policies.PRESETS)
    except ScenarioError:
        return False
    return True


def test_every_hooked_policy_is_tried():
    assert ("objective", "mcft") in hooked() and ("schedule", "modality_chain") in hooked()
    assert len(hooked()) >= 10


@pytest.mark.parametrize("section, name", hooked())
def test_validate_refuses_what_building_the_policies_refuses(section: str, name: str):
    own_refusals = 0
    for raw in cases(section, name):
        try:
            sc = Scenario.model_validate(merge_preset(raw, policies.PRESETS, None))
        except ValidationError:
            assert not validates(raw)
            continue
        sensors = dataset_sensors(sc.dataset_name, sc.dataset_params())
        try:
            build_policies(sc, sensors)  # what `raymm run` builds, all four bound to the run
        except Exception as exc:  # noqa: BLE001 - any refusal (or crash) of the build counts
            assert not validates(raw), f"build refuses ({exc}) what validate accepts: {raw}"
        else:
            continue
        policy = POLICY_SECTIONS[section].build(name, policy_params(sc, section))
        if own_hook(type(policy), "bind"):
            try:
                policy.bind(sc, sensors)
            except Exception:  # noqa: BLE001
                own_refusals += 1
    if own_hook(POLICY_SECTIONS[section].get(name), "bind"):
        assert own_refusals, f"no case tried makes {section} {name!r}'s bind refuse"


# --- the tiers: one set of rules, for validation and for building the population ----------
TIER_MISTAKES = [
    ([{"sensors": ["a"], "count": 3}, {"sensors": ["b"], "count": 3}], "counts add up to 6"),
    ([{"sensors": ["a"], "count": 6}, {"sensors": ["b"], "fraction": 0.5}], "every tier a count"),
    ([{"sensors": ["a"], "fraction": 0.9}, {"sensors": ["b"], "fraction": 0.9}],
     "fractions add up to 1.8"),
    ([{"sensors": ["a", "gyro"], "count": 12}], "'gyro' not in dataset 'synthetic'"),
    ([{"sensors": ["a", "b", "a"], "count": 12}], "'a' listed more than once"),
    ([], "give at least one tier"),
]


@pytest.fixture(scope="module")
def tiny_data():
    raw = tiny_scenario()["dataset"]
    return load_dataset("synthetic", {k: v for k, v in raw.items() if k != "name"}, 0)


@pytest.mark.parametrize("tiers, message", TIER_MISTAKES)
def test_tier_rules_have_one_home(tiny_data, tiers: list[dict[str, Any]], message: str):
    expected = tier_problems([TierSpec(**t) for t in tiers], 12, ("a", "b"), "synthetic")
    assert len(expected) == 1 and message in expected[0]
    with pytest.raises(ScenarioError) as validated:
        check_scenario(tiny_scenario(**{"population.tiers": tiers}), policies.PRESETS)
    assert validated.value.problems.count(expected[0]) == 1
    with pytest.raises(ScenarioError) as built:
        build_population(PopulationSpec(devices=12, tiers=tiers), tiny_data, 0)
    assert built.value.problems == expected


# --- the data's sizes: validate asks the loader's facts what building reads off the data ---
# Each case is refused by building the run from the loaded data (the partition, the local
# split, the model's size); `raymm validate` must refuse it with that message, before any
# data is loaded, and `raymm run` the same way.
SIZE_MISTAKES: dict[str, dict[str, Any]] = {
    "dirichlet needs more samples than the data has": {
        "population.partition.min_samples": 40},
    "iid leaves devices without a sample": {
        "population.devices": 500, "population.tiers": None,
        "population.partition": {"kind": "iid"}},
    "by_group on data without groups": {"population.partition": {"kind": "by_group"}},
    "by_group with another device count than groups": {
        "dataset": {"name": "bench", "clients": 10, "samples_per_client": 8, "dim": 4,
                    "test_samples": 50},
        "population.tiers": None, "population.partition": {"kind": "by_group"}},
    "a local test part that leaves devices no training sample": {
        "population.devices": 200, "population.tiers": None,
        "population.partition": {"kind": "iid"}, "population.local_test_fraction": 0.9},
    "a model too large for the data's inputs": {"model.hidden": 65_536,
                                                "model.embed_dim": 65_536},
}


def built_problems(raw: dict[str, Any]) -> list[str]:
    """What building the run from the loaded data refuses (as `raymm.app.build.build_world`)."""
    from raymm.app.build import build_world

    sc = Scenario.model_validate(merge_preset(raw, policies.PRESETS, None))
    with pytest.raises(ScenarioError) as built:
        build_world(sc)
    return built.value.problems


@pytest.mark.parametrize("case", SIZE_MISTAKES)
def test_validate_refuses_what_the_loaded_data_refuses(case: str, tmp_path,
                                                       capsys: pytest.CaptureFixture[str]):
    import yaml

    raw = tiny_scenario(**SIZE_MISTAKES[case])
    expected = built_problems(raw)
    assert len(expected) == 1, expected
    with pytest.raises(ScenarioError) as validated:
        check_scenario(raw, policies.PRESETS)
    assert validated.value.problems == expected
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(raw))
    for command in (["validate", str(path)], ["run", str(path), "--out", str(tmp_path)]):
        assert main(command) == 2
        assert f"  - {expected[0]}\n" in capsys.readouterr().err
    assert [p.name for p in tmp_path.iterdir()] == ["s.yaml"]  # run wrote nothing


# --- every problem of a scenario named at once --------------------------------------------
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


def test_per_device_scopes_need_a_local_test_part() -> None:
    from raymm.app.build import load_scenario
    from raymm.errors import ScenarioError

    from helpers import tiny_scenario

    for scope in ("devices", "both"):
        with pytest.raises(ScenarioError, match=f"eval.scope: '{scope}' needs population."
                                                "local_test_fraction"):
            load_scenario(tiny_scenario(**{"eval.scope": scope}))
        load_scenario(tiny_scenario(**{"eval.scope": scope,
                                       "population.local_test_fraction": 0.2}))


def test_private_blocks_need_raymms_network_and_per_device_evaluation() -> None:
    """`model.private` keeps blocks of raymm's own network on the devices: validation refuses
    a pooled evaluation (there is no global head) and another factory, and takes the presets
    as they are."""
    for method in ("blossom_ph", "blossom_phf"):
        check_scenario(tiny_scenario(method=method), policies.PRESETS)
    for scope in ("pooled", "both"):
        with pytest.raises(ScenarioError, match="set eval.scope: devices"):
            check_scenario(tiny_scenario(**{"method": "blossom_ph", "eval.scope": scope}),
                           policies.PRESETS)
    with pytest.raises(ScenarioError, match="raymm's own network"):
        check_scenario(tiny_scenario(**{"method": "blossom_ph", "model.factory": "whole_mlp"}),
                       policies.PRESETS)
