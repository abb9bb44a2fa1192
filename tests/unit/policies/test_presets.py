"""The named methods (policies.presets): every preset names registered policies with
parameters their models accept, each FedMChain ablation removes one component, and `--methods
all` runs the named methods, not the ablations."""

from __future__ import annotations

from pathlib import Path

import pytest

import policies
from raymm.app.validate import check_scenario
from raymm.protocol.registry import POLICY_SECTIONS

from helpers import tiny_scenario


@pytest.mark.parametrize("name", sorted(policies.PRESETS))
def test_every_preset_builds_its_policies_from_their_params(name: str) -> None:
    preset = policies.PRESETS[name]
    assert set(preset) >= {"selection", "aggregation"}, name
    for section, registry in POLICY_SECTIONS.items():
        spec = dict(preset.get(section, {}))
        if not spec:
            continue
        policy = spec.pop("name")
        assert policy in registry, (name, section, policy)
        registry.build(policy, spec)          # its parameters are the policy's own


def test_each_ablation_removes_one_component_and_is_not_a_method() -> None:
    full = policies.PRESETS["fedmchain"]
    differs = {}
    for name, preset in policies.PRESETS.items():
        if name.startswith("fedmchain_wo_"):
            differs[name] = sorted(k for k in full if preset.get(k) != full[k])
            assert name not in policies.METHODS
    assert differs == {"fedmchain_wo_mcft": ["objective", "schedule"],
                       "fedmchain_wo_ssca": ["aggregation"], "fedmchain_wo_ra": ["objective"],
                       "fedmchain_wo_rc": ["objective"], "fedmchain_wo_rarc": ["objective"]}
    assert set(policies.METHODS) <= set(policies.PRESETS)


def test_a_scenarios_own_keys_override_its_preset() -> None:
    sc = check_scenario(tiny_scenario(method="fedyogi", **{"aggregation.eta": 0.5}),
                        policies.PRESETS)
    assert sc.aggregation.name == "fedyogi" and sc.aggregation.params()["eta"] == 0.5
    assert sc.selection.name == "random" and sc.objective.name == "ce"


# --------------------------------------------------------------------------- BLOSSOM
def _blossom_host(method: str) -> tuple:
    """A host of two devices holding both sensors under `method`, and the server's groups."""
    import numpy as np

    from raymm.app.build import build_world, load_scenario
    from raymm.device.host import DeviceHost
    from raymm.server.server import Server

    sc = load_scenario(tiny_scenario(**{
        "method": method, "population.devices": 2,
        "population.tiers": [{"sensors": ["a", "b"], "count": 2}],
        "population.local_test_fraction": 0.25, "selection.k": 2}))
    world = build_world(sc)
    host = DeviceHost(np.arange(2), world.population, world.dataset, world.host_spec)
    return host, Server(sc, world.dataset, world.population, world.policies)


def test_blossom_hand_computed_block_wise_mean_and_private_heads() -> None:
    """BLOSSOM's rule θ_ℓ ← Σ_{i∈S_ℓ} n_i θ_{i,ℓ} / Σ_{i∈S_ℓ} n_i (kept when S_ℓ is empty), by
    hand: two devices holding both sensors, n = 1 and 3. Encoder vectors 1 and 5 -> 4; under
    PH the fusion layer (all that is left of `shared`) 2 and 6 -> 5, while the heads never
    travel: device 0 keeps 1, device 1 keeps 3, and each trains from and is evaluated with
    its own; a sensor nobody sent keeps its vector."""
    import numpy as np

    from raymm.models.layout import PRIVATE
    from raymm.protocol.device_state import DeviceState
    from raymm.protocol.messages import Broadcast, RoundPlan, merge_results
    from raymm.protocol.registry import AGGREGATORS
    from raymm.protocol.seams import AggregationContext

    from helpers import host_result

    host, server = _blossom_host("blossom_ph")
    sizes = server.layout.sizes
    assert PRIVATE not in server.params and set(server.params) == {"sensor:a", "sensor:b",
                                                                     "shared"}
    assert sizes["shared"] == 16 * 16 + 16            # the fusion layer only (2 embeddings of 8)
    ones = {g: np.ones((1, sizes[g]), np.float32) for g in ("sensor:a", "shared")}
    batch = merge_results([host_result([0, 1], [1, 3],
                                       {"sensor:a": np.concatenate([ones["sensor:a"],
                                                                    5 * ones["sensor:a"]]),
                                        "shared": np.concatenate([2 * ones["shared"],
                                                                  6 * ones["shared"]])},
                                       {"sensor:a": [0, 1], "shared": [0, 1]})])
    params = {g: np.full(n, 9.0, np.float32) for g, n in sizes.items() if g in server.params}
    agg = AGGREGATORS.build("fedavg", {})
    out = agg.aggregate(params, batch, AggregationContext(1, ("a", "b"), None, 0))  # type: ignore[arg-type]
    assert np.all(out["sensor:a"] == 4.0)             # (1·1 + 3·5) / 4
    assert np.all(out["shared"] == 5.0)               # (1·2 + 3·6) / 4
    assert np.all(out["sensor:b"] == 9.0)             # nobody sent it: kept
    # the heads: each device's own, for its training and its evaluation
    head = host.trainer.initial_private.size
    assert head == 16 * 4 + 4
    host.states = {0: DeviceState(private=np.full(head, 1.0, np.float32)),
                   1: DeviceState(private=np.full(head, 3.0, np.float32))}
    bcast = Broadcast(2, out, {})
    plan = RoundPlan(2, np.array([0, 1]), tuple(server.layout.groups))
    for dev, own in ((0, 1.0), (1, 3.0)):
        groups = host.groups_of(host.pop.sensor_mask[dev], plan)
        assert groups == ["sensor:a", "sensor:b", "shared", PRIVATE]
        start, _ = host.start_vectors(plan, bcast, dev, groups, host.state_of(dev))
        assert np.all(start[PRIVATE] == own) and np.all(start["sensor:a"] == 4.0)
        assert np.all(host._eval_vectors(bcast, dev, host.state_of(dev))[PRIVATE] == own)


def test_blossom_private_heads_train_on_the_device_and_never_travel(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A round of PH on both training paths (lock-step strict: no fallback): the devices upload
    encoders and fusion only, their heads move away from the initial ones and stay in their
    states; PHF uploads the encoders alone."""
    import numpy as np

    from raymm.training.lockstep.fallback import STRICT_VAR

    monkeypatch.setenv(STRICT_VAR, "1")

    from raymm.device.lockstep_host import make_host
    from raymm.models.layout import PRIVATE
    from raymm.protocol.messages import Broadcast, RoundPlan

    for method, sent in (("blossom_ph", {"sensor:a", "sensor:b", "shared"}),
                         ("blossom_phf", {"sensor:a", "sensor:b"})):
        host, server = _blossom_host(method)
        lockstep = make_host(host.ids, host.pop, host.trainer.dataset, host.spec)
        assert getattr(lockstep, "lockstep", None) is not None    # trains in lock-step
        plan = RoundPlan(1, np.array([0, 1]), tuple(server.layout.groups))
        results = [h.train(plan, Broadcast(1, server.params, {})) for h in (host, lockstep)]
        for h, res in zip((host, lockstep), results):
            assert set(res.updates) | set(res.partials) == sent, method
            for dev in (0, 1):
                own = h.state_of(dev).private
                assert own is not None and own.shape == h.trainer.initial_private.shape
                assert not np.array_equal(own, h.trainer.initial_private)
        mine, theirs = host.state_of(1).private, lockstep.state_of(1).private
        assert mine is not None and theirs is not None
        np.testing.assert_allclose(mine, theirs, atol=1e-5)
        assert PRIVATE not in server.params


# --------------------------------------------------------------------------- FedMultimodal
def _attention_step(method: str) -> None:
    """The survey's attention case through the method's own network: one head, E = 1,
    W1 = 1, b1 = 0, w2 = 1 (b2 = 0: left out); e1 = 0.5, e2 = -0.5 -> a1 =
    1/(1 + exp(-2·tanh 0.5)) = 0.715904 and z = 0.715904·0.5 − 0.284096·0.5 = 0.215904;
    sensor b absent -> a1 = 1 and z = 0.5 exactly (masked, not zero-filled). The fusion's
    projection is set to pass the pooled value through (weight 1 to z_0, bias 0)."""
    import torch

    from raymm.app.build import load_scenario
    from raymm.models.attention import AttentionFusion
    from raymm.models.build import build_net

    sc = load_scenario(tiny_scenario(**{
        "method": method, "model.embed_dim": 1, "model.attention_heads": 1,
        "model.attention_hidden": 1}))
    assert sc.model.fusion == "attention"
    net = build_net(("a", "b"), {"a": (8,), "b": (6,)}, 4, sc.model, sc.seed)
    fusion = net.fusion
    assert isinstance(fusion, AttentionFusion)
    with torch.no_grad():
        fusion.pool.score.weight.fill_(1.0)
        fusion.pool.score.bias.zero_()
        fusion.pool.weigh.weight.fill_(1.0)
        fusion.project.weight.zero_()
        fusion.project.weight[0, 0] = 1.0
        fusion.project.bias.zero_()
    emb = {"a": torch.tensor([[0.5]]), "b": torch.tensor([[-0.5]])}
    x = {"a": torch.zeros(1, 8), "b": torch.zeros(1, 6)}
    both = net(x, torch.tensor([[1.0, 1.0]]), embeddings=emb).z
    assert both is not None and both[0, 0].item() == pytest.approx(0.215904, abs=1e-6)
    alone = net(x, torch.tensor([[1.0, 0.0]]), embeddings=emb).z
    assert alone is not None and alone[0, 0].item() == 0.5


def test_fedmultimodal_is_fedavg_with_attention_fusion_by_hand() -> None:
    fedavg = policies.PRESETS["fedavg"]
    fm, opt = policies.PRESETS["fedmultimodal"], policies.PRESETS["fedmultimodal_opt"]
    assert fm == {**fedavg, "model": {"fusion": "attention"}}
    assert opt == {**fm, "aggregation": {"name": "fedadam"}}
    assert {"fedmultimodal", "fedmultimodal_opt"} <= set(policies.METHODS)
    _attention_step("fedmultimodal")


@pytest.mark.parametrize("method", ["fedmultimodal", "gramfeddhar"])
def test_attention_methods_train_in_lock_step_as_sequentially(
        method: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Attention fusion under vmap (strict: no fallback) gives the sequential path's numbers
    to float32 rounding, DP's clipping and noise included."""
    import numpy as np

    from raymm.app.api import run
    from raymm.app.build import load_scenario
    from raymm.training.lockstep.fallback import STRICT_VAR

    monkeypatch.setenv(STRICT_VAR, "1")
    res = {path: run(load_scenario(tiny_scenario(**{
        "method": method, "rounds": 2, "execution.training.path": path})),
        out=tmp_path / path).params for path in ("lockstep", "sequential")}
    for g, v in res["sequential"].items():
        np.testing.assert_allclose(res["lockstep"][g], v, atol=2e-5, err_msg=g)


# --------------------------------------------------------------------------- GraMFedDHAR
def test_gramfeddhar_attention_and_one_private_aggregation_step_by_hand() -> None:
    """The attention case of FedMultimodal, then one central-DP aggregation step with σ = 0:
    a device whose trained `shared` vector is θ + (3, 4) uploads the update clipped to C = 1,
    (0.6, 0.8)·(1 − 10⁻⁶) (raymm's float32 guard), and the server releases θ + that sum over
    the fixed denominator D = min(k, N) = 5: θ + (0.12, 0.16)·(1 − 10⁻⁶)."""
    from types import SimpleNamespace

    import numpy as np

    from raymm.app.build import load_scenario
    from raymm.protocol.messages import HostResult, RoundPlan, merge_results
    from raymm.protocol.privacy import privatize
    from raymm.server.privacy import PrivacyLedger

    preset = policies.PRESETS["gramfeddhar"]
    assert preset["privacy"] == {"mode": "central", "clip": 1.0, "noise_multiplier": 1.0}
    assert preset["selection"] == {"name": "tide_participation"}
    assert preset["model"] == {"fusion": "attention", "attention_heads": 1}
    assert preset["aggregation"] == {"name": "fedavg"} and preset["objective"] == {"name": "ce"}
    assert preset["training"]["lr"] == 1e-3 and "gramfeddhar" in policies.METHODS
    _attention_step("gramfeddhar")

    sc = load_scenario(tiny_scenario(**{"method": "gramfeddhar",
                                        "privacy.noise_multiplier": 0.0}))
    assert sc.privacy.clip == 1.0 and sc.selection.k == 5
    theta = np.array([0.0, 2.0], np.float32)
    upload, extra = privatize(sc.privacy, sc.seed, 1, 0, {"shared": theta + [3.0, 4.0]},
                              {"shared": theta}, sc.privacy.clip, None)
    np.testing.assert_array_equal(upload["shared"],
                                  (np.array([0.6, 0.8]) * (1 - 1e-6)).astype(np.float32))
    assert extra == {}
    n = 12
    pop = SimpleNamespace(n=n, sensor_mask=np.ones((n, 2), bool), sensors=("a", "b"),
                          online=lambda t, ids: np.ones(len(ids), bool))
    joint = SimpleNamespace(eligible=lambda t, mask, sensors: np.ones(len(mask), bool))
    ledger = PrivacyLedger(sc, pop, {"shared": 2}, schedule=joint)
    assert ledger.denominators["shared"] == 5.0
    ids = np.array([0])
    batch = merge_results([HostResult(ids, np.array([7]), np.zeros(1), np.zeros(1),
                                      {"shared": upload["shared"][None, :]},
                                      {"shared": np.array([0])})])
    out = ledger.release(1, RoundPlan(1, ids, ("shared",)), {"shared": theta}, batch)
    want = theta.astype(np.float64) + np.array([0.12, 0.16]) * (1 - 1e-6)
    np.testing.assert_allclose(out.means["shared"], want, rtol=0, atol=2.5e-7)  # float32
    assert 0.1199998 < out.means["shared"][0] < 0.12   # the guard shows where θ_0 = 0
