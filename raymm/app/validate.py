"""Whole-scenario validation: schema, policies, dataset, and cross-field rules, all at once.

Every check building a run makes is made here too, before any data is loaded: the dataset's
sensors come from its params alone (`DatasetLoader.sensors`), each policy's `check_scenario`
sees them (the rules its `bind` enforces), and the tiers follow `population.tier_problems`,
the same function `build_population` applies. The data's sizes (training samples, groups,
input shapes, classes) come from the loader's `DataFacts` (params, or array headers of its
file): the partition's rules (`population.partition_problems`, `local_split_problem`) and the
model's size (`safety.model_problem`) are the functions building applies to the loaded data.
A loader that cannot tell its facts without loading leaves those checks to the build.

The policy registries must be populated (import `policies`) before calling `check_scenario`;
the caller (CLI or `raymm.app.api`) does that, so this module never imports the policies package.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from pydantic import TypeAdapter, ValidationError

from raymm.app.plugins import labelled
from raymm.config.limits import (
    bound_problems,
    data_size_problem,
    fraction_problems,
    number_type_problems,
    value_problems,
)
from raymm.config.renamed import migrate, notice
from raymm.config.schema import Scenario, TierSpec, deep_merge, format_validation_error
from raymm.data import DATASETS
from raymm.data.base import loader_facts
from raymm.errors import ScenarioError
from raymm.io.paths import name_problems, special_file_problem
from raymm.models.factory import (
    NEEDS_TEXT,
    ModelContext,
    ModelContractError,
    ModelFacts,
    build_from_factory,
    check_output,
)
from raymm.models.size import model_size_problem
from raymm.population.devices import tier_problems
from raymm.population.partition import iid_sizes, local_split_problem, partition_problems
from raymm.population.traces import trace_problems
from raymm.protocol.exchange import aggregator_problems
from raymm.protocol.registry import AGGREGATORS, OBJECTIVES, POLICY_SECTIONS, policy_params
from raymm.protocol.seams import Aggregator

#: ends the problem of a name nothing registered: where other names come from
PLUGIN_HINT = "; or load the plugin that registers it (--plugin MODULE)"


def check_scenario(raw: Mapping[str, Any], presets: Mapping[str, Mapping[str, Any]],
                   source: str | None = None) -> Scenario:
    """Return the validated Scenario, or raise one ScenarioError listing every problem.

    Schema errors and the cross-field checks are gathered together: the cross-field checks run
    on the raw (preset-merged) mapping, so a typo in one section never hides a mistake in another.
    """
    merged, renames, problems = migrate(merge_preset(raw, presets, source))
    notice(renames, source)
    problems += safety_problems(merged)
    try:
        sc: Scenario | None = Scenario.model_validate(merged)
    except ValidationError as exc:
        sc = None
        problems += format_validation_error(exc)
    dataset_problems: list[str] = []
    sensors = _check_dataset(merged.get("dataset"), dataset_problems)
    problems += _check_policies(merged, sc, sensors)
    problems += dataset_problems
    raw_pop = merged.get("population")
    pop: Mapping[str, Any] = raw_pop if isinstance(raw_pop, dict) else {}
    # sensors are known only for a valid dataset section (none at all means synthetic)
    dataset = (merged.get("dataset") or {}).get("name", "synthetic") \
        if sensors is not None else ""
    problems += _check_tiers(pop, sensors, dataset)
    if sensors is not None:
        problems += _check_encoders(merged.get("model"), sensors)
    problems += _check_k(merged.get("selection"), pop)
    if sc is not None:
        problems += _check_population(sc)
        problems += _check_exchange(sc)
        problems += _check_dataset_rules(sc)
        problems += _check_execution(sc)
        problems += privacy_problems(sc)
        problems += private_problems(sc)
        if sensors is not None:
            problems += _check_data_sizes(sc, sensors)
    if problems:
        raise ScenarioError(list(dict.fromkeys(problems)), source)
    assert sc is not None
    return sc


def safety_problems(merged: Mapping[str, Any]) -> list[str]:
    """Checks the schema's types cannot express (raymm.config.limits): a safe run name, finite
    numbers within int64 and this simulator's bounds, no boolean or quoted text for a number,
    availability and hardware fractions that cover the population."""
    problems = name_problems(merged.get("name"))
    problems += value_problems(dict(merged)) + bound_problems(merged)
    problems += number_type_problems(Scenario, merged)
    for section, registry in POLICY_SECTIONS.items():
        spec = merged.get(section)
        if isinstance(spec, dict) and isinstance(spec.get("name"), str) and \
                spec["name"] in registry:
            problems += number_type_problems(registry.params_model(spec["name"]), spec,
                                             f"{section}.")
    return problems + fraction_problems(merged.get("population"))


def _check_k(selection: object, population: Mapping[str, Any]) -> list[str]:
    """K ≤ N, on the raw sections (so it is reported next to schema errors elsewhere); a
    missing key means the schema's default."""
    defaults = Scenario.model_fields
    k = (selection if isinstance(selection, dict) else {}).get(
        "k", defaults["selection"].default.k)
    n = population.get("devices", defaults["population"].default.devices)
    if isinstance(k, int) and isinstance(n, int) and k > n >= 1:
        return [f"selection.k: K={k} is larger than population.devices={n}"]
    return []


def _check_execution(sc: Scenario) -> list[str]:
    """A GPU asked for where Ray would give none (the machine's CUDA is checked at start)."""
    ex = sc.execution
    if ex.accelerator == "cuda" and ex.executor == "ray" and ex.actor.num_gpus <= 0:
        return ["execution.accelerator: cuda needs GPUs for the DeviceActors; set "
                "execution.actor.num_gpus > 0 (e.g. 0.25 packs four actors per GPU)"]
    return []


def merge_preset(raw: Mapping[str, Any], presets: Mapping[str, Mapping[str, Any]],
                 source: str | None) -> dict[str, Any]:
    method = raw.get("method")
    if method is None:
        return dict(raw)
    if not isinstance(method, str) or method not in presets:
        raise ScenarioError(
            [f"method: unknown preset {method!r}; choose one of: "
             f"{', '.join(labelled('preset', sorted(presets)))}{PLUGIN_HINT}"], source)
    return deep_merge(presets[method], raw)


def _check_policies(merged: Mapping[str, Any], sc: Scenario | None,
                    sensors: tuple[str, ...] | None) -> list[str]:
    """Names and parameters of every policy section; then each policy's own cross-field rules
    (an optional `check_scenario(params, scenario, sensors)` hook: everything its `bind`
    would refuse), once the schema itself is valid. `sensors` is None when the dataset section
    is itself invalid (reported with the dataset)."""
    problems = []
    defaults = Scenario.model_fields
    for section, registry in POLICY_SECTIONS.items():
        spec = merged.get(section)
        if spec is None:
            spec = defaults[section].default.model_dump()
        if not isinstance(spec, dict):
            continue  # the schema already reported it
        name = spec.get("name", defaults[section].default.name)
        if not isinstance(name, str) or name not in registry:
            problems.append(f"{section}.name: unknown {registry.kind} {name!r}; choose one "
                            f"of: {', '.join(labelled(section, registry.names()))}"
                            f"{PLUGIN_HINT}")
            continue
        raw_params = {k: v for k, v in spec.items() if k not in ("name", "k")}
        try:
            params = registry.params_model(name)(**raw_params)
        except ValidationError as exc:
            problems += [f"{section}.{p}" for p in format_validation_error(exc)]
            continue
        # a policy's own cross-field rules (e.g. a loss that needs aux heads; default: none)
        if sc is not None:
            problems += registry.get(name).check_scenario(params, sc, sensors)
    return problems


def _check_dataset(spec: object, problems: list[str]) -> tuple[str, ...] | None:
    if spec is None:
        spec = {"name": "synthetic"}
    if not isinstance(spec, dict):
        return None
    name = spec.get("name")
    if not isinstance(name, str) or name not in DATASETS:
        problems.append(f"dataset.name: unknown dataset {name!r}; choose one of: "
                        f"{', '.join(labelled('dataset', sorted(DATASETS)))}{PLUGIN_HINT}")
        return None
    loader = DATASETS[name]
    try:
        params = loader.Params(**{k: v for k, v in spec.items() if k != "name"})
    except ValidationError as exc:
        problems += [f"dataset.{p}" for p in format_validation_error(exc)]
        return None
    problems += number_type_problems(loader.Params, spec, "dataset.")
    for path in loader.required_files(params):
        if not path.exists():
            problems.append(f"dataset.path: data file not found: {path} (relative paths are "
                            "resolved under $RAYMM_DATA, else the working directory)")
        elif (problem := special_file_problem(path, "dataset.path")) is not None:
            problems.append(problem)
    size = data_size_problem(name, params)
    if size is not None:
        problems.append(size)
    return tuple(loader.sensors(params))


def _check_data_sizes(sc: Scenario, sensors: tuple[str, ...]) -> list[str]:
    """What building refuses on the loaded data's sizes, from the loader's `DataFacts`."""
    loader = DATASETS[sc.dataset_name]
    facts = loader_facts(loader, loader.Params(**sc.dataset_params()))
    if facts is None:
        return []
    pop = sc.population
    problems = partition_problems(pop, facts.n_train, facts.groups)
    if not problems and pop.partition.kind == "iid" and pop.local_test_fraction is not None:
        empty = local_split_problem(iid_sizes(facts.n_train, pop.devices),
                                    pop.local_test_fraction)
        problems += [empty] if empty else []
    return problems + model_problems(sc, sensors, facts.shapes, facts.num_classes)


def model_problems(sc: Scenario, sensors: tuple[str, ...],
                   shapes: Mapping[str, tuple[int, ...]], num_classes: int) -> list[str]:
    """The scenario's model, built by its factory on torch's meta device for data of these
    shapes: what it refuses (an unknown factory, a module that breaks the contract of
    `raymm.models.factory`, logits of the wrong shape, more parameters than allowed) and
    what the method needs of it that it lacks (`Policy.model_needs`; pod-wise upload needs
    one group per sensor)."""
    ctx = ModelContext(sensors, {m: tuple(shapes[m]) for m in sensors}, num_classes, sc.model)
    with torch.device("meta"):  # shapes only: a huge model is a message, not a kill
        try:
            net = build_from_factory(ctx)
        except ModelContractError as exc:
            return [str(exc)]
        except Exception as exc:  # noqa: BLE001 - the factory failed: that is the message
            return [f"model: factory {sc.model.factory!r} cannot build a model for inputs of "
                    f"shapes { {m: list(ctx.shapes[m]) for m in sensors} }: "
                    f"{type(exc).__name__}: {exc}"]
        problems = [p for p in (model_size_problem(net), check_output(net, ctx)) if p]
    if problems and "meta tensors" in problems[-1] and len(problems) == 1:
        # an op with no meta kernel (one that reads a value): check the forward on real memory,
        # the size having passed
        problems = [p for p in (check_output(build_from_factory(ctx), ctx),) if p]
    facts = ModelFacts.of(net)
    needs: dict[str, list[str]] = {}
    if sc.training.upload == "held":
        needs.setdefault("sensor_groups", []).append("training.upload: held")
    for section, registry in POLICY_SECTIONS.items():
        name = getattr(sc, section).name
        try:
            wants = registry.get(name).model_needs(policy_params(sc, section))
        except (KeyError, ValidationError):
            continue  # an unknown policy or bad parameters: `_check_policies` reports it
        for need in wants:
            needs.setdefault(need, []).append(f"{section} {name!r}")
    for need in facts.missing(frozenset(needs)):
        problems.append(f"model.factory {sc.model.factory!r}: {', '.join(needs[need])} needs "
                        f"{NEEDS_TEXT[need]}, which this {facts.form} model lacks")
    return problems


def _check_dataset_rules(sc: Scenario) -> list[str]:
    """A loader's own cross-field rules: an optional `check_scenario(params, scenario)`, as
    policies have (e.g. a training pool that holds the test split needs per-device eval)."""
    loader = DATASETS.get(sc.dataset_name)
    check = getattr(loader, "check_scenario", None)
    if loader is None or check is None:
        return []
    try:
        params = loader.Params(**sc.dataset_params())
    except ValidationError:
        return []  # _check_dataset reported it
    return list(check(params, sc))


_TIERS: TypeAdapter[list[TierSpec] | None] = TypeAdapter(list[TierSpec] | None)


def _check_tiers(pop: Mapping[str, Any], sensors: tuple[str, ...] | None,
                 dataset: str) -> list[str]:
    """The tiers' rules (`population.tier_problems`), as soon as the tiers themselves pass the
    schema: a mistake elsewhere in the population never hides them."""
    try:
        tiers = _TIERS.validate_python(pop.get("tiers"))
    except ValidationError:
        return []  # the schema reports it
    devices = pop.get("devices", Scenario.model_fields["population"].default.devices)
    known = devices if isinstance(devices, int) and not isinstance(devices, bool) else None
    return tier_problems(tiers, known, sensors, dataset)


def _check_encoders(model: object, sensors: tuple[str, ...]) -> list[str]:
    encoders = model.get("encoders") if isinstance(model, dict) else None
    bad = [m for m in encoders if m not in sensors] if isinstance(encoders, dict) else []
    if bad:
        return [f"model.encoders: unknown sensor(s) {', '.join(map(repr, bad))}; "
                f"the dataset's sensors are: {', '.join(sensors)}"]
    return []


def _check_population(sc: Scenario) -> list[str]:
    """Availability and hardware need an entry with a share (the tiers: `_check_tiers`)."""
    pop, problems = sc.population, []
    for name, items in (("availability", pop.availability), ("hardware", pop.hardware)):
        if not items:
            problems.append(f"population.{name}: needs at least one entry")
        elif sum(x.fraction for x in items) <= 0:
            problems.append(f"population.{name}: fractions must not all be zero")
    return problems + trace_problems(pop.trace)


def _check_exchange(sc: Scenario) -> list[str]:
    problems = []
    if sc.eval.scope in ("devices", "both") and sc.population.local_test_fraction is None:
        problems.append(f"eval.scope: {sc.eval.scope!r} needs population.local_test_fraction "
                        "(e.g. 0.2)")
    if sc.training.sync_every > 1 and sc.training.exchange not in ("delta", "personal"):
        problems.append(f"training.sync_every: {sc.training.sync_every} needs training.exchange: "
                        f"delta or personal (got {sc.training.exchange!r})")
    name = sc.aggregation.name
    if name in AGGREGATORS:  # an unknown name is reported with the policies
        problems += aggregator_problems(sc.training.exchange, AGGREGATORS.get(name), name)
    return problems


def private_problems(sc: Scenario) -> list[str]:
    """What `model.private` needs: raymm's own network (whose blocks it names), and evaluation
    on the devices, each with its own blocks (the global model has none of its own: a pooled
    evaluation would score the initial head)."""
    blocks = sc.model.private
    if not blocks:
        return []
    problems = []
    if sc.model.factory != "multimodal":
        problems.append(f"model.private: {blocks} names blocks of raymm's own network "
                        f"(model.factory: multimodal), not of {sc.model.factory!r}")
    if sc.eval.scope != "devices":
        problems.append(f"model.private: {blocks} keeps them on each device, so there is no "
                        f"global model to evaluate: set eval.scope: devices "
                        f"(got {sc.eval.scope!r})")
    return problems


def privacy_problems(sc: Scenario) -> list[str]:
    """What `privacy:` needs of the rest of the scenario (docs/methods/privacy.md): devices
    send nothing besides their clipped updates, and in central mode the aggregator depends on
    them only through each group's mean (`combinable`) and keeps no per-device models."""
    p = sc.privacy
    if not p.on:
        return []
    problems = []
    if sc.training.exchange in ("none", "personal"):
        problems.append(f"privacy: training.exchange: {sc.training.exchange} uploads no "
                        "parameters; there is nothing to privatise")
    name = sc.aggregation.name
    if name in AGGREGATORS:
        try:
            agg = AGGREGATORS.build(name, AGGREGATORS.params_model(name)(
                **sc.aggregation.params()))
        except (ValidationError, ValueError, TypeError):
            agg = None  # reported with the policies
        if agg is not None:
            if not agg.combinable and (p.mode == "central" or sc.training.exchange != "delta"):
                problems.append(
                    f"privacy.mode: {p.mode} needs an aggregator that uses the updates only "
                    f"through their mean (combinable: fedavg, fedopt, tide with weighting: "
                    f"data, delta_mean); {name!r} reads every device's row"
                    + ("" if p.mode == "central" else
                       " (local DP can feed noised deltas to it: training.exchange: delta)"))
            if agg.overrides(Aggregator.cluster_models) and (p.mode == "central"
                                                             or agg.combinable):
                problems.append(f"privacy: aggregation {name!r} keeps per-device models, "
                                "which the private mean does not update")
    if sc.objective.name in OBJECTIVES:
        try:
            obj = OBJECTIVES.params_model(sc.objective.name)(**sc.objective.params())
        except (ValidationError, TypeError):
            obj = None
        sends = [k for k in ("lambda_p", "report_aux_loss") if getattr(obj, k, 0)]
        if sends:
            problems.append(f"privacy: objective {sc.objective.name!r} uploads class means or "
                            f"losses besides the update ({', '.join(sends)}); set "
                            + " and ".join(f"objective.{k}: " + ("0" if k == "lambda_p"
                                                                  else "false") for k in sends))
        if sc.objective.name in ("scaffold", "fedproto"):
            problems.append(f"privacy: objective {sc.objective.name!r} uploads control "
                            "variates or prototypes besides the update")
    if sc.schedule.params().get("order") == "adaptive":
        problems.append("privacy: schedule.order: adaptive has devices report unimodal "
                        "accuracies, which the mechanism does not cover")
    if p.sampling == "poisson" and sc.selection.name not in ("random", "fraction"):
        problems.append(f"privacy.sampling: poisson draws the cohort uniformly; selection "
                        f"{sc.selection.name!r} chooses its own (use random or fraction)")
    return problems
