"""Whole-scenario validation: schema, policies, dataset, and cross-field rules, all at once.

The policy registries must be populated (import `policies`) before calling `check_scenario`;
the caller (CLI or `raymm.api`) does that, so this module never imports the policies package.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ValidationError

from raymm.config import Scenario, format_validation_error, parse_scenario
from raymm.data import DATASETS
from raymm.errors import ScenarioError
from raymm.registry import AGGREGATORS, OBJECTIVES, SCHEDULES, SELECTORS, Registry

POLICY_SECTIONS: dict[str, Registry[Any]] = {
    "selection": SELECTORS, "aggregation": AGGREGATORS, "schedule": SCHEDULES,
    "objective": OBJECTIVES,
}


def check_scenario(raw: Mapping[str, Any], presets: Mapping[str, Mapping[str, Any]],
                   source: str | None = None) -> Scenario:
    """Return the validated Scenario, or raise one ScenarioError listing every problem."""
    sc = parse_scenario(raw, presets, source)
    problems: list[str] = []
    problems += _check_policies(sc)
    sensors = _check_dataset(sc, problems)
    if sensors is not None:
        problems += _check_sensors(sc, sensors)
    if sc.selection.k > sc.population.devices:
        problems.append(f"selection.k: K={sc.selection.k} is larger than population.devices="
                        f"{sc.population.devices}")
    problems += _check_population(sc)
    problems += _check_exchange(sc)
    if problems:
        raise ScenarioError(problems, source)
    return sc


def policy_params(sc: Scenario, section: str) -> BaseModel:
    """The validated parameter model of a scenario's policy section."""
    spec = getattr(sc, section)
    registry = POLICY_SECTIONS[section]
    return registry.params_model(spec.name)(**spec.params())


def _check_policies(sc: Scenario) -> list[str]:
    problems = []
    for section, registry in POLICY_SECTIONS.items():
        spec = getattr(sc, section)
        if spec.name not in registry:
            problems.append(f"{section}.name: unknown {registry.kind} {spec.name!r}; choose one "
                            f"of: {', '.join(registry.names())}")
            continue
        try:
            policy_params(sc, section)
        except ValidationError as exc:
            problems += [f"{section}.{p}" for p in format_validation_error(exc)]
    return problems


def _check_dataset(sc: Scenario, problems: list[str]) -> tuple[str, ...] | None:
    name = sc.dataset_name
    if name not in DATASETS:
        problems.append(f"dataset.name: unknown dataset {name!r}; choose one of: "
                        f"{', '.join(sorted(DATASETS))}")
        return None
    loader = DATASETS[name]
    try:
        params = loader.Params(**sc.dataset_params())
    except ValidationError as exc:
        problems += [f"dataset.{p}" for p in format_validation_error(exc)]
        return None
    for path in loader.required_files(params):
        if not path.exists():
            problems.append(f"dataset.path: data file not found: {path} (relative paths are "
                            "resolved under $RAYMM_DATA, else the working directory)")
    return tuple(loader.sensors(params))


def _check_sensors(sc: Scenario, sensors: tuple[str, ...]) -> list[str]:
    problems = []
    for i, tier in enumerate(sc.population.tiers or []):
        bad = [m for m in tier.sensors if m not in sensors]
        if bad:
            problems.append(f"population.tiers.{i}.sensors: {', '.join(map(repr, bad))} not in "
                            f"dataset {sc.dataset_name!r}; its sensors are: {', '.join(sensors)}")
    bad = [m for m in sc.model.encoders if m not in sensors]
    if bad:
        problems.append(f"model.encoders: unknown sensor(s) {', '.join(map(repr, bad))}; "
                        f"the dataset's sensors are: {', '.join(sensors)}")
    return problems


def _check_population(sc: Scenario) -> list[str]:
    pop, problems = sc.population, []
    tiers = pop.tiers or []
    counts = [t.count for t in tiers]
    if tiers and all(c is not None for c in counts) and sum(counts) != pop.devices:  # type: ignore[arg-type]
        problems.append(f"population.tiers: counts add up to {sum(counts)}, but "  # type: ignore[arg-type]
                        f"population.devices is {pop.devices}")
    elif tiers and any(c is not None for c in counts) and None in counts:
        problems.append("population.tiers: give every tier a count, or every tier a fraction")
    for name, items in (("availability", pop.availability), ("hardware", pop.hardware)):
        if not items:
            problems.append(f"population.{name}: needs at least one entry")
        elif sum(x.fraction for x in items) <= 0:
            problems.append(f"population.{name}: fractions must not all be zero")
    if tiers and all(t.fraction is not None for t in tiers) and \
            sum(t.fraction or 0 for t in tiers) <= 0:
        problems.append("population.tiers: fractions must not all be zero")
    return problems


def _check_exchange(sc: Scenario) -> list[str]:
    problems = []
    if sc.eval.scope == "devices" and sc.population.local_test_fraction is None:
        problems.append("eval.scope: 'devices' needs population.local_test_fraction (e.g. 0.2)")
    if sc.training.sync_every > 1 and sc.training.exchange != "delta":
        problems.append(f"training.sync_every: {sc.training.sync_every} needs training.exchange: "
                        f"delta (got {sc.training.exchange!r})")
    return problems
