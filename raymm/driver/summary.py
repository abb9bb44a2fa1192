"""What a run reports at its end: summary.json's entries and the devices table.

Pure functions of the round rows and the population (plus `finish_run`, which writes them
with the model files once the last round is done).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from raymm.config.schema import Scenario
from raymm.driver.rundir import RunWriter
from raymm.driver.tracking import policy_summary, summary_metrics
from raymm.models import saved
from raymm.population.devices import Population
from raymm.protocol.device_state import DeviceState
from raymm.protocol.messages import ClusterModels
from raymm.protocol.registry import AGGREGATORS, policy_params
from raymm.protocol.seams import Aggregator
from raymm.sim.engine import PERSONAL, Executor, World
from raymm.units import GIB


def finish_run(sc: Scenario, world: World, ex: Executor, writer: RunWriter, last: int,
               wall: float, ended: str = "completed") -> tuple[dict[str, Any], dict[str, Any]]:
    """Write the model files, the final devices table and pictures, and summary.json (with
    `ended`: completed, interrupted or diverged); close the writer. Returns (summary, the
    server's final state)."""
    state = ex.server_state()
    saved.write(writer.path, sc, world.dataset, last, state["params"],
                     _cluster_models(sc, world.dataset.sensors, state["aggregator"]),
                     _kept(ex.host_states()))
    writer.write_devices(devices_table(world.population, state["obs"]))
    writer.end_pictures(world.population, sc.rounds)
    if sc.clock.mode == "seconds" and writer.rows:
        writer.availability_over_time(world.population,
                                      float(writer.rows[-1].get("sim_seconds_total", 0.0)))
    summary = summarize(sc, writer.rows, last, wall, world.population.n)
    summary["ended"] = ended
    if "privacy" in summary and state.get("privacy"):
        summary["privacy"].update(device_ledger(state["privacy"]))
    extra = getattr(ex, "summary", None)  # an asynchronous run's staleness, wasted work
    if extra is not None:
        summary.update(extra(writer.rows))
    if len(summary.get("phase_order", ())) > 1:
        writer.add_text("phase_order", " → ".join(summary["phase_order"]))
    writer.write_summary(summary)
    writer.close()
    return summary, state


def device_ledger(privacy_state: dict[str, Any]) -> dict[str, Any]:
    """summary.json's per-device privacy ledger: every device's ε so far (by device id), the
    worst device and the median."""
    eps = np.asarray(privacy_state["device_epsilon"], np.float64)
    if not eps.size:
        return {}
    worst = int(np.argmax(eps))
    return {"device_epsilon": [float(e) for e in eps], "worst_device": worst,
            "worst_device_epsilon": float(eps[worst]),
            "median_device_epsilon": float(np.median(eps)),
            "participations": np.asarray(privacy_state["selected_count"]).astype(int).tolist()}


def _cluster_models(sc: Scenario, sensors: tuple[str, ...], aggregator_state: dict[str, Any]
                    ) -> ClusterModels | None:
    """The aggregator's cluster models (None for most methods), asked of a fresh instance
    loaded with the run's aggregator state: on Ray the live one sits in the ServerActor."""
    agg = AGGREGATORS.build(sc.aggregation.name, policy_params(sc, "aggregation"))
    if not agg.overrides(Aggregator.cluster_models):
        return None
    agg.bind(sc, sensors)
    agg.load_state_dict(aggregator_state)
    return agg.cluster_models()


def _kept(hosts: dict[int, Any]) -> dict[int, dict[str, np.ndarray]]:
    """Per device (from its state record, `raymm.protocol.device_state`), the parameters it keeps:
    its adapter, its own group vectors, its own batch-norm statistics and its private blocks
    (bases, control variates and other bookkeeping are not model parameters)."""
    out = {}
    for dev, record in hosts.items():
        st = DeviceState.from_record(record)
        keep = {saved.PARAMS_PREFIX + g: np.asarray(v) for g, v in st.params.items()}
        if st.adapter is not None:
            keep[saved.LOCAL_KEY] = np.asarray(st.adapter)
        if st.buffers is not None:
            keep[saved.BUFFERS_KEY] = np.asarray(st.buffers)
        if st.private is not None:
            keep[saved.PRIVATE_KEY] = np.asarray(st.private)
        if keep:
            out[int(dev)] = keep
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
    if pop.data_group is not None:  # partition.kind: grouped
        table["group"] = pop.data_group
    if pop.trace is not None and pop.trace_entry is not None:  # population.trace
        table["trace_entry"] = [pop.trace.names[e] for e in pop.trace_entry]
        table["up_mbps"] = pop.up_bps * 8 / 1e6
        table["down_mbps"] = pop.down_bps * 8 / 1e6
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
    """summary.json: the run's identity, headline accuracies, traffic, time and the metrics
    of `raymm.server.metrics` (Acc@B, best round, what the policies chose)."""
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
    if sc.privacy.on and rows:  # the guarantee of the whole run, and what it rests on
        end: dict[str, Any] = rows[-1]
        summary["privacy"] = {
            "mode": sc.privacy.mode, "accountant": sc.privacy.accountant,
            "clip_unit": sc.privacy.clip_unit,
            **{k.partition("/")[2]: v for k, v in end.items() if k.startswith("privacy/")}}
    summary.update(time_summary(sc, rows))
    if rows:  # per-round averages (traffic in bytes, simulated seconds)
        summary["mean_bytes_per_round"] = float(np.mean([r["bytes_up"] + r["bytes_down"]
                                                         for r in rows]))
        summary["mean_sim_seconds_per_round"] = float(np.mean([r["sim_seconds"] for r in rows]))
    return summary


def time_summary(sc: Scenario, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """summary.json's simulated-time entries: accuracy against simulated hours, the first
    simulated time at `clock.target_accuracy`, the share of device work wasted (updates lost to
    departures or dropped at the round's end), departures and idle time. Under the seconds
    clock, or when a target is set; empty otherwise (round-clock summaries stay as they were)."""
    target = sc.clock.target_accuracy
    if sc.clock.mode != "seconds" and target is None:
        return {}
    evals = [r for r in rows if r.get("accuracy") is not None]
    out: dict[str, Any] = {
        "sim_hours": (rows[-1].get("sim_seconds_total", 0.0) if rows else 0.0) / 3600.0,
        "accuracy_vs_sim_hours": [[float(r.get("sim_seconds_total", 0.0)) / 3600.0,
                                   float(r["accuracy"])] for r in evals]}
    if target is not None:
        hit = next((r for r in evals if float(r["accuracy"]) >= target), None)
        out["target_accuracy"] = target
        out["time_to_target_hours"] = None if hit is None else \
            float(hit.get("sim_seconds_total", 0.0)) / 3600.0
        out["rounds_to_target"] = None if hit is None else int(hit["round"])
    if sc.clock.mode == "seconds" and rows:
        end = rows[-1]
        out["wasted_work_share"] = float(end.get("wasted_share", 0.0))
        out["work_device_hours"] = float(end.get("work_seconds_total", 0.0)) / 3600.0
        out["wasted_device_hours"] = float(end.get("wasted_seconds_total", 0.0)) / 3600.0
        out["departed"] = int(sum(int(r.get("departed", 0)) for r in rows))
        out["idle_hours"] = float(sum(float(r.get("idle_seconds", 0.0)) for r in rows)) / 3600.0
    return out
