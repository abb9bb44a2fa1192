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
from raymm.app.api import run
from raymm.app.build import build_world, load_scenario
from raymm.app.variants import method_variant
from raymm.config.schema import read_yaml
from raymm.sim.serial import SerialExecutor

from helpers import REPO
from needs import full_data

SCENARIO = REPO / "scenarios" / "fedmchain_synthetic.yaml"
FAST = ["rounds=6", "training.sync_every=1", "eval.every=3"]


def test_phases_train_send_and_aggregate_only_the_active_modality() -> None:
    sc = load_scenario(SCENARIO, FAST)
    world = build_world(sc)
    ex = SerialExecutor(devices_per_host=5)
    ex.start(world)
    sizes = ex.server.layout.sizes
    sensors = world.population.sensors
    has_frozen: set[tuple[int, str]] = set()   # (device, group) sent its final copy
    for t in range(1, sc.rounds + 1):
        server_before = copy.deepcopy(ex.server.params)
        clusters_before = copy.deepcopy(ex.server.policies.aggregator.models)
        devices_before = copy.deepcopy({d: s.to_record() for h in ex.hosts
                                        for d, s in h.states.items()})
        plan, bcast = ex.plan(t, ex.poll(t))
        m = ["dom", "mid", "weak"][(t - 1) // 2]
        active = f"sensor:{m}"
        assert plan.active_groups == (active,)
        assert world.population.sensor_mask[plan.selected, sensors.index(m)].all()
        trained = ex.train(t, (plan, bcast))
        results = trained.results
        assert all(set(r.updates) == {active} for r in results)
        stats = ex.aggregate(t, (plan, bcast), trained).row
        n_sent = sum(r.updates[active].shape[0] for r in results)
        assert stats["bytes_up"] == n_sent * sizes[active] * 4
        # the phase's group, plus each earlier modality a device holds, sent once
        frozen = 0
        for d in plan.selected.tolist():
            for p in ["dom", "mid", "weak"][:["dom", "mid", "weak"].index(m)]:
                if world.population.sensor_mask[d, sensors.index(p)] and \
                        (d, p) not in has_frozen:
                    has_frozen.add((d, p))
                    frozen += sizes[f"sensor:{p}"] * 4
        assert stats["bytes_down"] == plan.selected.shape[0] * sizes[active] * 4 + frozen
        for g, v in ex.server.params.items():
            if g != active:
                assert np.array_equal(v, server_before[g]), (t, g)
        for g, v in ex.server.policies.aggregator.models.items():
            if g != active:
                assert np.array_equal(v, clusters_before[g]), (t, g)
        assert not np.array_equal(ex.server.params[active], server_before[active])
        for h in ex.hosts:
            for d, state in h.states.items():
                st = state.to_record()
                for key, v in devices_before.get(d, {}).items():
                    if not key.endswith(active):
                        assert np.array_equal(st[key], v), (t, d, key)


def test_a_phase_two_device_trains_on_the_earlier_branch_it_is_evaluated_with(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """R_a, R_c and the fused prediction of a phase-2 device read the earlier modality's
    branch through the model's forward: that branch must be exactly the one the device is
    evaluated with (its cluster's model), not an own stale copy."""
    from raymm.models import MultimodalNet
    from raymm.protocol import exchange

    sc = load_scenario(SCENARIO, ["rounds=6", "training.sync_every=1",
                                  "aggregation.min_cluster_size=1"])
    world = build_world(sc)
    ex = SerialExecutor(devices_per_host=24)
    ex.start(world)
    host = ex.hosts[0]
    seen: list[tuple[int, np.ndarray]] = []
    current: list[int] = []
    train = host.trainer.train

    def spy_train(device: int, *args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        current[:] = [device]
        return train(device, *args, **kwargs)

    forward = MultimodalNet.forward

    def spy_forward(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        if self is host.trainer.model and current:
            seen.append((current[0], host.trainer.layout.flatten(self, ["sensor:dom"])
                         ["sensor:dom"].copy()))
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(host.trainer, "train", spy_train)
    monkeypatch.setattr(MultimodalNet, "forward", spy_forward)
    dom = world.population.sensors.index("dom")
    checked = 0
    for t in range(1, sc.rounds + 1):
        plan, bcast = ex.plan(t, ex.poll(t))
        seen.clear()
        ex.aggregate(t, (plan, bcast), ex.train(t, (plan, bcast)))
        if t not in (3, 4):   # phase 2 ("mid") of dom -> mid -> weak, 2 rounds per phase
            continue
        payload = ex.server.eval_payload(t)
        for device, vec in seen:
            if not world.population.sensor_mask[device, dom]:
                continue
            evaluated = exchange.eval_vectors("delta", payload, device,
                                              host.state_of(device),
                                              host.trainer.initial)["sensor:dom"]
            np.testing.assert_array_equal(vec, evaluated)
            own = host.state_of(device).params.get("sensor:dom")
            if own is not None:   # it trained dom in phase 1: that copy is not what it uses
                assert not np.array_equal(vec, own)
            checked += 1
    cm = ex.server.policies.aggregator.cluster_models()
    assert len(np.unique(cm.params["sensor:dom"], axis=0)) > 1   # several cluster models
    assert checked > 0


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
                                    "fedmchain_wo_rc", "fedmchain_wo_rarc", "harmony",
                                    "fedproto", "fedadam", "fedyogi", "fedadagrad"])
def test_every_baseline_and_ablation_runs_on_the_same_scenario(method: str,
                                                               tmp_path: Path) -> None:
    raw = method_variant(read_yaml(SCENARIO), method, policies.PRESETS)
    raw["rounds"] = 3  # one per phase of the three-modality chain
    res = run(raw, out=tmp_path)
    assert res.summary["final_accuracy"] is not None
    traffic = res.summary["bytes_up"] + res.summary["bytes_down"]
    assert (traffic == 0) == (method == "local")


@pytest.mark.parametrize("name", ["fedmchain_synthetic.yaml", "fedmchain_avdigits.yaml"])
def test_scenarios_validate(name: str) -> None:
    if name == "fedmchain_avdigits.yaml":
        full_data("fsdd_audio_8k.npz", "mnist_test_28x28.npz")
    sc = load_scenario(SCENARIO.parent / name)
    assert sc.method == "fedmchain" and sc.eval.scope == "devices"
    assert sc.population.local_test_fraction == 0.2 and sc.selection.name == "fraction"


@pytest.mark.slow
def test_the_chain_lifts_the_weak_modality_where_joint_training_suppresses_it(
        tmp_path: Path) -> None:
    """The imbalance FedMChain targets, on the synthetic benchmark: jointly trained (FedAvg,
    summed logits) the weak branch stalls on the multimodal devices; the chain gives it its own
    phase. Measured (seed 0): weak-only accuracy 39.6% against FedAvg's 30.8%, MIR 2.09 vs
    2.25, at less than half the traffic."""
    raw = read_yaml(SCENARIO.parent / "fedmchain_synthetic_imbalanced.yaml")
    out = {m: run(method_variant(raw, m, policies.PRESETS), out=tmp_path).summary
           for m in ("fedmchain", "fedavg")}
    chain, joint = out["fedmchain"], out["fedavg"]
    assert chain["final_acc_sensor/weak"] >= joint["final_acc_sensor/weak"] + 0.05
    assert chain["final_mir"] < joint["final_mir"]
    assert chain["bytes_up"] + chain["bytes_down"] < 0.5 * (joint["bytes_up"] + joint["bytes_down"])
