"""`raymm.run`: the one entry point shared by the CLI and scenario scripts.

This module composes the core with the policies and (lazily) the Ray layer; it is one of the
two places in `raymm` allowed to import `policies` and `actors`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

import policies
from raymm.config import Scenario, apply_overrides, read_yaml
from raymm.data import load_dataset
from raymm.engine import Executor, World, is_eval_round, run_rounds
from raymm.exchange import check_aggregator
from raymm.host import HostSpec
from raymm.population import Population, build_population
from raymm.registry import AGGREGATORS, OBJECTIVES, SCHEDULES, SELECTORS
from raymm.rundir import GIB, RunWriter, new_run_dir
from raymm.server import Policies
from raymm.validate import check_scenario, policy_params


def load_scenario(source: str | Path | Mapping[str, Any], overrides: Sequence[str] = ()
                  ) -> Scenario:
    """Read (if a path), apply `key.path=value` overrides, merge the preset, validate."""
    raw = read_yaml(source) if isinstance(source, (str, Path)) else dict(source)
    raw = apply_overrides(raw, overrides)
    return check_scenario(raw, policies.PRESETS, str(source) if isinstance(source, (str, Path))
                          else None)


def build_world(sc: Scenario) -> World:
    """Load data, build the population and instantiate the policies (nothing is written)."""
    dataset = load_dataset(sc.dataset_name, sc.dataset_params(), sc.seed)
    population = build_population(sc.population, dataset, sc.seed)
    pol = Policies(
        selector=SELECTORS.build(sc.selection.name, policy_params(sc, "selection")),
        aggregator=AGGREGATORS.build(sc.aggregation.name, policy_params(sc, "aggregation")),
        schedule=SCHEDULES.build(sc.schedule.name, policy_params(sc, "schedule")))
    objective = OBJECTIVES.build(sc.objective.name, policy_params(sc, "objective"))
    # policies that need run-level facts (rounds, the dataset's sensors) read them here
    for policy in (pol.selector, pol.aggregator, pol.schedule, objective):
        bind = getattr(policy, "bind", None)
        if bind is not None:
            bind(sc, dataset.sensors)
    check_aggregator(sc.training.exchange, pol.aggregator, sc.aggregation.name)
    return World(sc, dataset, population, pol, HostSpec(sc.seed, sc.model, sc.training, objective))


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


def run(scenario: str | Path | Mapping[str, Any] | Scenario, overrides: Sequence[str] = (),
        out: str | Path | None = None, executor: str | None = None,
        progress: bool = False) -> RunResult:
    """Validate, build, run every round, and write the run directory. Returns the summary."""
    sc = scenario if isinstance(scenario, Scenario) else load_scenario(scenario, overrides)
    if executor is not None:
        sc = sc.model_copy(update={"execution": sc.execution.model_copy(
            update={"executor": executor})})
    world = build_world(sc)          # data errors surface here, before anything is written
    ex = make_executor(sc)
    ex.start(world)
    try:
        run_dir = new_run_dir(out if out is not None else sc.output.dir, sc.name)
        writer = RunWriter(run_dir, sc.to_dict(), sc.output.tensorboard)
        writer.add_text("scenario", "```yaml\n" + (run_dir / "config.yaml").read_text() + "```")
        writer.write_devices(devices_table(world.population))
        bar = _progress(sc, progress)

        def on_round(row: dict[str, Any]) -> None:
            writer.log_round(row)
            if is_eval_round(row["round"], sc):
                writer.flush_rounds()
            if bar is not None:
                bar.update(1)
                bar.set_postfix(_postfix(writer.rows), refresh=False)

        import time

        t0 = time.perf_counter()
        last = run_rounds(ex, sc, 1, on_round)
        wall = time.perf_counter() - t0
        if bar is not None:
            bar.close()
        writer.flush_rounds()
        state = ex.server_state()
        writer.write_devices(devices_table(world.population, state["obs"]))
        summary = summarize(sc, writer.rows, last, wall, world.population.n)
        writer.write_summary(summary)
        writer.close()
        params = {g: np.asarray(v) for g, v in state["params"].items()}
        return RunResult(run_dir, summary, writer.rows, params)
    finally:
        ex.shutdown()


def _progress(sc: Scenario, enabled: bool):  # noqa: ANN202
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=sc.rounds, desc=sc.name, unit="round", dynamic_ncols=True)


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
        if k.startswith(("acc_tier/", "acc_sensor/")) or k in ("acc_multimodal", "mir"):
            summary[f"final_{k}"] = v
    if rows:  # per-round averages (traffic in bytes, simulated seconds)
        summary["mean_bytes_per_round"] = float(np.mean([r["bytes_up"] + r["bytes_down"]
                                                         for r in rows]))
        summary["mean_sim_seconds_per_round"] = float(np.mean([r["sim_seconds"] for r in rows]))
    return summary
