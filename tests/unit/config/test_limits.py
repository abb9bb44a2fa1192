"""Numbers a scenario may ask for (raymm.config.limits): finite, inside int64, below what the
simulator holds, numbers where numbers belong, shares that add up to one."""

from __future__ import annotations

from types import SimpleNamespace

from raymm.config.limits import (
    MAX_DATA_VALUES,
    bound_problems,
    data_size_problem,
    fraction_problems,
    number_type_problems,
    value_problems,
)
from raymm.config.schema import Scenario


def test_non_finite_and_out_of_range_values_are_named_by_path() -> None:
    raw = {"training": {"lr": float("inf")}, "population": {"tiers": [{"count": 2**63}]},
           "name": "x", "ok": True}
    assert value_problems(raw) == [
        "training.lr: must be a finite number (got inf)",
        "population.tiers.0.count: integer out of range (at most 9223372036854775807 in "
        "magnitude)"]


def test_sizes_above_what_the_simulator_holds_are_refused() -> None:
    assert bound_problems({"rounds": 10_000_000, "population": {"devices": 5}}) == []
    assert bound_problems({"rounds": 10_000_001, "model": {"hidden": 1 << 20}}) == [
        "rounds: 1e+07 is more than this simulator allows (10,000,000)",
        "model.hidden: 1.04858e+06 is more than this simulator allows (65,536)"]


def test_a_boolean_or_quoted_number_where_a_number_belongs_is_named() -> None:
    raw = {"rounds": True, "training": {"lr": "0.1", "optimizer": "sgd"}, "name": "123"}
    assert number_type_problems(Scenario, raw) == [
        "rounds: expected a number, got true",
        "training.lr: expected a number, got the text '0.1' (write it without quotes)"]


def test_fractions_add_up_to_one_and_generated_data_has_a_size_limit() -> None:
    pop = {"availability": [{"fraction": 0.5}, {"fraction": 0.4}],
           "hardware": [{"fraction": 0.25}, {"fraction": 0.75}]}
    assert fraction_problems(pop) == ["population.availability: fractions add up to 0.9, not 1"]
    sensors = {"a": SimpleNamespace(dim=1000, length=1000)}
    small = SimpleNamespace(sensors=sensors, n_train=100, n_test=10, classes=2)
    assert data_size_problem("synthetic", small) is None
    huge = SimpleNamespace(sensors=sensors, n_train=MAX_DATA_VALUES, n_test=0, classes=2)
    assert data_size_problem("synthetic", huge).startswith("dataset: ")
    assert data_size_problem("har", huge) is None
