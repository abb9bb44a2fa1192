"""`raymm.run`: the one entry point shared by the CLI and scenario scripts.

This module composes the core with the policies and (lazily) the Ray layer; it is one of the
two places in `raymm` allowed to import `policies` and `actors`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

import policies
from raymm import checkpoint, divergence, model_file
from raymm.config import Scenario, apply_overrides, read_yaml
from raymm.data import load_dataset
from raymm.engine import PERSONAL, Executor, World, is_eval_round, run_rounds
from raymm.errors import Interrupted, RaymmError, ResumeError, ScenarioError
from raymm.faults import fault_seed
from raymm.host import HostSpec
from raymm.metrics import RunTracker, policy_summary, summary_metrics
from raymm.population import Population, build_population
from raymm.policy import Objective
from raymm.registry import AGGREGATORS, OBJECTIVES, SCHEDULES, SELECTORS
from raymm.rundir import GIB, RunWriter, new_run_dir
from raymm.safety import model_problem, writable_dir_problem
from raymm.server import Policies
from raymm.validate import check_scenario, policy_params


def load_scenario(source: str | Path | Mapping[str, Any], overrides: Sequence[str] = ()
                  ) -> Scenario:
    """Read (if a path), apply `key.path=value` overrides, merge the preset, validate."""
    raw = read_yaml(source) if isinstance(source, (str, Path)) else dict(source)
    raw = apply_overrides(raw, overrides)
    return check_scenario(raw, policies.PRESETS, str(source) if isinstance(source, (str, Path))
                          else None)


def presets() -> Mapping[str, Mapping[str, Any]]:
    """Every named method (preset), for callers that may not import `policies` themselves."""
    return policies.PRESETS


def method_names() -> list[str]:
    """The methods "every method" means (`raymm sweep --methods all`): presets minus
    ablations."""
    return list(policies.METHODS)


def build_world(sc: Scenario) -> World:
    """Load data, build the population and instantiate the policies (nothing is written)."""
    dataset = load_dataset(sc.dataset_name, sc.dataset_params(), sc.seed)
    too_big = model_problem(dataset, sc.model)
    if too_big:
        raise ScenarioError([too_big])
    population = build_population(sc.population, dataset, sc.seed)
    pol, objective = build_policies(sc, dataset.sensors)
    combinable = pol.aggregator.combinable
    host_spec = HostSpec(sc.seed, sc.model, sc.training, objective, sc.faults,
                         fault_seed(sc.faults, sc.seed),
                         combine=combinable and sc.faults.deadline_seconds is None,
                         device=sc.execution.device)
    return World(sc, dataset, population, pol, host_spec)


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
    if sc.execution.executor == "serial":
        from raymm.serial import SerialExecutor

        dpa = sc.execution.devices_per_actor
        return SerialExecutor(None if dpa == "auto" else int(dpa))
    from actors.ray_executor import RayExecutor

    return RayExecutor(sc.execution)


@dataclass
class RunResult:
    run_dir: Path
    summary: dict[str, Any]
    rows: list[dict[str, Any]]
    params: dict[str, np.ndarray]


def resolve_resume(resume: str | Path, scenario: Any, overrides: Sequence[str]
                   ) -> tuple[Scenario, Path, checkpoint.Checkpoint]:
    """The saved scenario of a run directory and its newest checkpoint; a scenario given as
    well must be the same one (where and how it executes may differ)."""
    run_dir = Path(resume)
    ckpt = checkpoint.load(run_dir)
    saved = load_scenario(read_yaml(run_dir / "config.yaml"))
    if checkpoint.scenario_digest(saved.to_dict()) != ckpt.scenario_digest:
        raise ResumeError(f"--resume: {run_dir}/config.yaml no longer matches its checkpoint")
    if scenario is not None or overrides:
        given = scenario if isinstance(scenario, Scenario) else load_scenario(
            scenario if scenario is not None else saved.to_dict(), overrides)
        if checkpoint.scenario_digest(given.to_dict()) != ckpt.scenario_digest:
            raise ResumeError(f"--resume: {run_dir} is a run of another scenario "
                              f"({saved.name!r}); only execution.* and output.* may differ")
        saved = given
    return saved, run_dir, ckpt


def run(scenario: str | Path | Mapping[str, Any] | Scenario | None = None,
        overrides: Sequence[str] = (), out: str | Path | None = None,
        executor: str | None = None, progress: bool = False,
        resume: str | Path | None = None,
        on_round: Callable[[dict[str, Any]], bool | None] | None = None) -> RunResult:
    """Validate, build, run every round, and write the run directory. Returns the summary.

    With `resume=RUN_DIR` the run continues from that directory's newest checkpoint and ends
    with the same parameters and rounds table as an uninterrupted run. `on_round` is called
    with each round's row once it is logged (outside the round's timed wall); returning True
    stops the run after that round, as early stopping does.
    """
    ckpt = None
    if resume is not None:
        sc, run_dir, ckpt = resolve_resume(resume, scenario, overrides)
    elif scenario is None:
        raise RaymmError("run: give a scenario, or resume a run directory")
    else:
        sc = scenario if isinstance(scenario, Scenario) else load_scenario(scenario, overrides)
    if executor is not None:
        sc = sc.model_copy(update={"execution": sc.execution.model_copy(
            update={"executor": executor})})
    if ckpt is None:
        out_problem = writable_dir_problem(Path(out if out is not None else sc.output.dir))
        if out_problem:
            raise RaymmError(out_problem)
    world = build_world(sc)          # data errors surface here, before anything is written
    ex = make_executor(sc)
    ex.start(world)
    try:
        if ckpt is None:
            run_dir = new_run_dir(out if out is not None else sc.output.dir, sc.name)
            writer = RunWriter(run_dir, sc.to_dict(), sc.output.tensorboard,
                               budget_gib=sc.eval.budget_gib)
            writer.add_text("scenario", "```yaml\n" + (run_dir / "config.yaml").read_text()
                            + "```")
            writer.write_devices(devices_table(world.population))
            writer.start_pictures(world.population, world.dataset, sc.rounds)
            first, wall_before = 1, 0.0
        else:
            checkpoint.restore(ex, ckpt, run_dir)
            writer = RunWriter(run_dir, None, sc.output.tensorboard, rows=ckpt.rows,
                               purge_step=ckpt.round + 1, budget_gib=sc.eval.budget_gib)
            writer.selected = dict(ckpt.selected)
            writer.class_names = tuple(world.dataset.class_names)
            first, wall_before = ckpt.round + 1, ckpt.wall_seconds
        return _loop(sc, world, ex, writer, first, wall_before, progress, on_round)
    finally:
        ex.shutdown()


def _loop(sc: Scenario, world: World, ex: Executor, writer: RunWriter, first: int,
          wall_before: float, progress: bool,
          user_hook: Callable[[dict[str, Any]], bool | None] | None = None) -> RunResult:
    bar = _progress(sc, progress, first - 1)
    digest = checkpoint.scenario_digest(sc.to_dict())
    # a staged method (e.g. Harmony) counts early-stopping patience in its last stage only
    tracker = RunTracker(sc.eval.budget_gib, sc.eval.early_stop_patience,
                         int(world.policies.schedule.final_stage_start))
    for row in writer.rows:  # a resumed run replays its history (best so far, patience)
        tracker.update(row)
    t0 = time.perf_counter()

    def save_checkpoint(t: int) -> None:
        checkpoint.save(writer.path, checkpoint.Checkpoint(
            t, digest, ex.server_state(), ex.host_states(), list(writer.rows),
            wall_before + time.perf_counter() - t0, dict(writer.selected)),
            sc.output.keep_checkpoints)

    # (round, devices) once training produced non-finite numbers
    diverged: list[tuple[int, list[int]]] = []
    with StopOnInterrupt() as stop:
        def on_round(row: dict[str, Any]) -> bool:
            bad = row.pop(divergence.KEY, None)
            if bad is not None:
                diverged.append((row["round"], bad))
            early_stop = tracker.update(row) or bad is not None
            writer.log_round(row)
            if user_hook is not None:
                early_stop = bool(user_hook(row)) or early_stop
            t = row["round"]
            every = sc.output.checkpoint_every
            if is_eval_round(t, sc) or (every and t % every == 0) or stop.requested:
                writer.flush_rounds()
            if every and t % every == 0 and not stop.requested:
                save_checkpoint(t)
            if bar is not None:
                bar.update(1)
                bar.set_postfix(_postfix(writer.rows), refresh=False)
            _say_faults(row, bar)
            return stop.requested or early_stop

        last = run_rounds(ex, sc, first, on_round)
    if bar is not None:
        bar.close()
    wall = wall_before + time.perf_counter() - t0
    writer.flush_rounds()
    if stop.requested:
        save_checkpoint(last)
    state = ex.server_state()
    model_file.write(writer.path, sc, world.dataset, last, state["params"],
                     model_file.cluster_models(sc, world.dataset.sensors, state["aggregator"]),
                     ex.host_states())
    writer.write_devices(devices_table(world.population, state["obs"]))
    writer.end_pictures(world.population, sc.rounds)
    summary = summarize(sc, writer.rows, last, wall, world.population.n)
    if len(summary.get("phase_order", ())) > 1:
        writer.add_text("phase_order", " → ".join(summary["phase_order"]))
    writer.write_summary(summary)
    writer.close()
    if diverged:
        round_, devices = diverged[0]
        raise divergence.TrainingDiverged(round_, devices, sc, writer.path)
    if stop.requested and last < sc.rounds:
        raise Interrupted(writer.path, last)
    params = {g: np.asarray(v) for g, v in state["params"].items()}
    return RunResult(writer.path, summary, writer.rows, params)


class StopOnInterrupt:
    """First Ctrl-C: finish the round in flight, then stop cleanly. Second: stop at once."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: Any = None

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        print("\nraymm: stopping after this round (Ctrl-C again to abort at once)",
              file=sys.stderr, flush=True)

    def __enter__(self) -> StopOnInterrupt:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)


def _progress(sc: Scenario, enabled: bool, done: int):  # noqa: ANN202
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=sc.rounds, initial=done, desc=sc.name, unit="round", dynamic_ncols=True)


def _say_faults(row: dict[str, Any], bar: Any) -> None:
    """Injected or real faults of a round: one line on stderr (above the progress bar)."""
    from raymm.faults import summary_line

    line = summary_line(row)
    if line is None:
        return
    if bar is not None:
        bar.write(f"raymm: {line}", file=sys.stderr)
    else:
        print(f"raymm: {line}", file=sys.stderr, flush=True)


def _postfix(rows: list[dict[str, Any]]) -> dict[str, str]:
    last = rows[-1]
    acc = next((r["accuracy"] for r in reversed(rows) if "accuracy" in r), None)
    out = {"round": str(last["round"]), "traffic": f"{last['bytes_total'] / 2**20:.1f}MiB"}
    if acc is not None:
        out["acc"] = f"{acc:.3f}"
    return out


def devices_table(pop: Population, obs: dict[str, np.ndarray] | None = None) -> pa.Table:
    """One row per device: sensors, tier, availability pattern, hardware, samples, selections."""
    tiers = ["+".join(s) for s in pop.tier_sensors]
    table = {
        "device": np.arange(pop.n),
        "sensors": [tiers[t] for t in pop.tier],
        "tier": pop.tier,
        "pattern": [pop.pattern_names[p] for p in pop.pattern],
        "period": pop.period, "online_per_period": pop.online_len, "phase": pop.phase,
        "hardware": [pop.hardware_names[h] for h in pop.hardware],
        "gflops": pop.gflops, "samples": pop.num_samples,
    }
    if obs is not None:
        table["times_selected"] = obs["times_selected"]
        table["times_online"] = obs["times_online"]
    return pa.table(table)


def personal_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """With `eval.scope: both`: the last per-device evaluation (`final_personal_accuracy`, per
    tier, ...: the model and adapter each device ends the run with) and the best mean personal
    accuracy of any evaluation (`best_personal_accuracy`). Empty for other scopes."""
    evals = [r for r in rows if r.get(f"{PERSONAL}accuracy") is not None]
    if not evals:
        return {}
    out = {f"final_{k}": v for k, v in evals[-1].items()
           if k.startswith(PERSONAL) and k != f"{PERSONAL}devices_evaluated"}
    out[f"best_{PERSONAL}accuracy"] = max(r[f"{PERSONAL}accuracy"] for r in evals)
    return out


def summarize(sc: Scenario, rows: list[dict[str, Any]], last: int, wall: float,
              n_devices: int) -> dict[str, Any]:
    accs = [r["accuracy"] for r in rows if r.get("accuracy") is not None]
    final = rows[-1] if rows else {}
    summary: dict[str, Any] = {
        "name": sc.name, "seed": sc.seed, "method": sc.method,
        "executor": sc.execution.executor, "rounds_completed": last,
        "final_accuracy": accs[-1] if accs else None,
        "best_accuracy": max(accs) if accs else None,
        "bytes_up": sum(r["bytes_up"] for r in rows),
        "bytes_down": sum(r["bytes_down"] for r in rows),
        "gib_total": (final.get("bytes_total", 0)) / GIB,
        "wall_seconds": wall,
        "wall_seconds_per_round": wall / max(len(rows), 1),
        "sim_seconds": final.get("sim_seconds_total", 0.0),
        "devices": n_devices,
        "mean_selected": float(np.mean([r["selected"] for r in rows])) if rows else 0.0,
        "mean_online": float(np.mean([r["online"] for r in rows])) if rows else 0.0,
    }
    for k, v in final.items():
        if k.startswith(("acc_tier/", "acc_sensor/", "acc_head/", "acc_drop/")) or \
                k in ("acc_multimodal", "mir", "acc_proto"):
            summary[f"final_{k}"] = v
    summary.update(personal_summary(rows))
    summary.update(summary_metrics(rows, sc.eval.budget_gib))
    summary.update(policy_summary(rows))
    if rows:  # per-round averages (traffic in bytes, simulated seconds)
        summary["mean_bytes_per_round"] = float(np.mean([r["bytes_up"] + r["bytes_down"]
                                                         for r in rows]))
        summary["mean_sim_seconds_per_round"] = float(np.mean([r["sim_seconds"] for r in rows]))
    return summary
