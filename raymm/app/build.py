"""Building a run from a scenario: read and validate it, load the data, build the population,
the policies and the executor. Nothing here writes a file or runs a round.

This module composes the core with the policies and (lazily) the Ray layer; with `raymm.app.api`
it is one of the few places in `raymm` allowed to import `policies` and `actors`.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import policies  # noqa: F401  (registers every policy and raymm's presets)
from raymm.app import plugins
from raymm.app.validate import check_scenario
from raymm.config.schema import Scenario, apply_overrides, read_yaml
from raymm.data import load_dataset
from raymm.device.host import HostSpec
from raymm.errors import ScenarioError
from raymm.models.build import build_model
from raymm.models.size import model_problem
from raymm.population.devices import build_population
from raymm.population.faults import fault_seed
from raymm.protocol.privacy import with_selection_secret
from raymm.protocol.registry import (
    AGGREGATORS,
    METHODS,
    OBJECTIVES,
    PRESETS,
    SCHEDULES,
    SELECTORS,
    policy_params,
)
from raymm.protocol.seams import Objective
from raymm.server.server import Policies
from raymm.sim.async_loop import AsyncExecutor
from raymm.sim.engine import Executor, World
from raymm.sim.serial import SerialExecutor
from raymm.training.lockstep.fallback import why_not_lockstep


def load_scenario(source: str | Path | Mapping[str, Any], overrides: Sequence[str] = ()
                  ) -> Scenario:
    """Read (if a path), apply `key.path=value` overrides, merge the preset, validate. The
    installed distributions' plugins are loaded first (`raymm.app.plugins`), so a scenario
    may name what they register."""
    plugins.load()
    raw = read_yaml(source) if isinstance(source, (str, Path)) else dict(source)
    raw = apply_overrides(raw, overrides)
    return check_scenario(raw, PRESETS, str(source) if isinstance(source, (str, Path))
                          else None)


def with_executor(sc: Scenario, executor: str | None) -> Scenario:
    """`sc` run by `executor` (serial or ray) instead of its own; unchanged for None. The
    executor is not part of a run's identity (`checkpoint.scenario_digest`)."""
    if executor is None:
        return sc
    return sc.model_copy(update={"execution": sc.execution.model_copy(
        update={"executor": executor})})


def presets() -> Mapping[str, Mapping[str, Any]]:
    """Every named method (preset): raymm's own and those plugins registered."""
    return PRESETS


def method_names() -> list[str]:
    """The methods "every method" means (`raymm sweep --methods all`): presets minus
    ablations, plugins' included."""
    return list(METHODS)


def build_world(sc: Scenario) -> World:
    """Load data, build the population and instantiate the policies (nothing is written)."""
    sc = with_selection_secret(sc)
    dataset = load_dataset(sc.dataset_name, sc.dataset_params(), sc.seed)
    too_big = model_problem(dataset.sensors, {m: dataset.sensor_shape(m) for m in
                                              dataset.sensors}, dataset.num_classes, sc.model)
    if too_big:
        raise ScenarioError([too_big])
    population = build_population(sc.population, dataset, sc.seed)
    pol, objective = build_policies(sc, dataset.sensors)
    combinable = pol.aggregator.combinable
    host_spec = HostSpec(sc.seed, sc.model, sc.training, objective, sc.faults,
                         fault_seed(sc.faults, sc.seed),
                         # a round that may drop devices (deadline, seconds clock) needs rows
                         combine=combinable and sc.faults.deadline_seconds is None
                         and sc.clock.mode == "rounds",
                         accelerator=sc.execution.accelerator, privacy=sc.privacy,
                         engine=sc.execution.training)
    return World(sc, dataset, population, pol, host_spec)


def training_path_notice(sc: Scenario, world: World) -> str | None:
    """With `execution.training.path: lockstep` (the default) but lock-step training not
    possible for this scenario's objective or model: say once, on stderr, that devices train
    sequentially and why (each host would otherwise say it in its own log). Returns the notice."""
    if not sc.execution.training.lockstep:
        return None
    objective = world.host_spec.objective
    # raymm's own network has no buffers; a plugin's model is built once to look
    model = build_model(world.dataset, sc.model, sc.seed) if sc.model.factory != "multimodal" \
        and why_not_lockstep(objective) is None else None
    reason = why_not_lockstep(objective, model)
    if reason is None:
        return None
    notice = f"raymm: notice: devices train sequentially (not in lock-step): {reason}"
    print(notice, file=sys.stderr, flush=True)
    return notice


def build_policies(sc: Scenario, sensors: tuple[str, ...]) -> tuple[Policies, Objective]:
    """The scenario's selector, aggregator and schedule, and its objective, bound to the run.

    Policies that need run-level facts (rounds, the dataset's sensors) read them in their
    `bind`, which refuses what their `check_scenario` reports (so `raymm validate` has already
    refused it). Needs no data: the sensors may come from the dataset's params alone."""
    pol = Policies(
        selector=SELECTORS.build(sc.selection.name, policy_params(sc, "selection")),
        aggregator=AGGREGATORS.build(sc.aggregation.name, policy_params(sc, "aggregation")),
        schedule=SCHEDULES.build(sc.schedule.name, policy_params(sc, "schedule")))
    objective = OBJECTIVES.build(sc.objective.name, policy_params(sc, "objective"))
    for policy in (pol.selector, pol.aggregator, pol.schedule, objective):
        policy.bind(sc, sensors)
    return pol, objective


def make_executor(sc: Scenario) -> Executor:
    """Where the rounds run: in this process (`serial`) or in Ray actors (`ray`), which get
    the run's plugin modules (`plugins.worker_code`). An asynchronous aggregator (FedBuff,
    FedAsync) runs its event loop around either (`raymm.sim.async_loop`)."""
    inner = _plain_executor(sc)
    if getattr(AGGREGATORS.get(sc.aggregation.name), "asynchronous", False):
        return AsyncExecutor(inner)
    return inner


def _plain_executor(sc: Scenario) -> Executor:
    if sc.execution.executor == "serial":
        dpa = sc.execution.devices_per_actor
        return SerialExecutor(None if dpa == "auto" else int(dpa))
    # deferred: Ray is imported only by runs on the Ray executor
    from actors.ray_executor import RayExecutor

    modules, paths = plugins.worker_code(sc)
    return RayExecutor(sc.execution, modules, paths)
