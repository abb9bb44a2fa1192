"""FedMChain end to end on the synthetic three-modality scenario (serial executor).

The phase test follows every round: only the phase's modality is trained, sent, counted and
aggregated; every other branch stays bit-identical on the server and on every device.
"""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest

import policies
from raymm.api import build_world, load_scenario, run
from raymm.config import read_yaml
from raymm.serial import SerialExecutor
from raymm.variants import method_variant

SCENARIO = Path(__file__).parents[2] / "scenarios" / "fedmchain_synthetic.yaml"
FAST = ["rounds=6", "training.sync_every=1", "eval.every=3"]


def test_phases_train_send_and_aggregate_only_the_active_modality() -> None:
    sc = load_scenario(SCENARIO, FAST)
    world = build_world(sc)
    ex = SerialExecutor(devices_per_host=5)
    ex.start(world)
    sizes = ex.server.layout.sizes
    sensors = world.population.sensors
    for t in range(1, sc.rounds + 1):
        server_before = copy.deepcopy(ex.server.params)
        clusters_before = copy.deepcopy(ex.server.policies.aggregator.models)
        devices_before = copy.deepcopy({d: s for h in ex.hosts for d, s in h.device_state.items()})
        plan, bcast = ex.plan(t, ex.poll(t))
        m = ["dom", "mid", "weak"][(t - 1) // 2]
        active = f"sensor:{m}"
        assert plan.active_groups == (active,)
        assert world.population.sensor_mask[plan.selected, sensors.index(m)].all()
        trained = ex.train(t, (plan, bcast))
        results = trained.results
        assert all(set(r.updates) == {active} for r in results)
        stats = ex.aggregate(t, (plan, bcast), trained)
        n_sent = sum(r.updates[active].shape[0] for r in results)
        assert stats["bytes_up"] == n_sent * sizes[active] * 4
        assert stats["bytes_down"] == plan.selected.shape[0] * sizes[active] * 4
        for g, v in ex.server.params.items():
            if g != active:
                assert np.array_equal(v, server_before[g]), (t, g)
        for g, v in ex.server.policies.aggregator.models.items():
            if g != active:
                assert np.array_equal(v, clusters_before[g]), (t, g)
        assert not np.array_equal(ex.server.params[active], server_before[active])
        for h in ex.hosts:
            for d, st in h.device_state.items():
                for key, v in devices_before.get(d, {}).items():
                    if not key.endswith(active):
                        assert np.array_equal(st[key], v), (t, d, key)


def test_fedmchain_run_reports_device_metrics(tmp_path: Path) -> None:
    res = run(SCENARIO, FAST, out=tmp_path)
    s = res.summary
    for key in ("final_accuracy", "final_acc_tier/dom", "final_acc_tier/dom+mid+weak",
                "final_acc_multimodal", "final_acc_sensor/weak", "final_mir",
                "mean_bytes_per_round", "mean_sim_seconds_per_round", "wall_seconds_per_round"):
        assert s[key] is not None and np.isfinite(s[key]), key
    assert s["final_mir"] >= 1.0
    import pyarrow.parquet as pq

    rounds = pq.read_table(res.run_dir / "rounds.parquet").to_pydict()
    assert rounds["phase"] == ["dom", "dom", "mid", "mid", "weak", "weak"]
    assert rounds["mir"][2] is not None and rounds["acc_multimodal"][5] is not None


@pytest.mark.parametrize("method", ["fedavg", "fedprox", "scaffold", "local",
                                    "fedmchain_wo_mcft", "fedmchain_wo_ssca", "fedmchain_wo_ra",
                                    "fedmchain_wo_rc", "fedmchain_wo_rarc"])
def test_every_baseline_and_ablation_runs_on_the_same_scenario(method: str,
                                                               tmp_path: Path) -> None:
    raw = method_variant(read_yaml(SCENARIO), method, policies.PRESETS)
    raw["rounds"] = 3  # one per phase of the three-modality chain
    res = run(raw, out=tmp_path)
    assert res.summary["final_accuracy"] is not None
    traffic = res.summary["bytes_up"] + res.summary["bytes_down"]
    assert (traffic == 0) == (method == "local")


def test_device_state_is_checkpointable() -> None:
    """Own parameters, bases and control variates survive DeviceHost.state_dict/load."""
    sc = load_scenario(SCENARIO, ["rounds=6", "training.sync_every=2"])
    world = build_world(sc)
    ex = SerialExecutor(devices_per_host=6)
    ex.start(world)
    for t in (1, 2):
        plan, bcast = ex.plan(t, ex.poll(t))
        ex.aggregate(t, (plan, bcast), ex.train(t, (plan, bcast)))
    saved = ex.host_states()
    assert saved and all("params/sensor:dom" in s and "base/sensor:dom" in s
                         for s in saved.values())
    fresh = SerialExecutor(devices_per_host=4)      # another packing reads the same states
    fresh.start(world)
    fresh.load_host_states(saved)
    again = fresh.host_states()
    assert sorted(again) == sorted(saved)
    for d, s in saved.items():
        assert all(np.array_equal(v, again[d][k]) for k, v in s.items())


@pytest.mark.parametrize("name", ["fedmchain_synthetic.yaml", "fedmchain_avdigits.yaml"])
def test_scenarios_validate(name: str) -> None:
    if name == "fedmchain_avdigits.yaml" and "RAYMM_DATA" not in __import__("os").environ:
        pytest.skip("needs RAYMM_DATA")
    sc = load_scenario(SCENARIO.parent / name)
    assert sc.method == "fedmchain" and sc.eval.scope == "devices"
    assert sc.population.local_test_fraction == 0.2 and sc.selection.name == "fraction"
