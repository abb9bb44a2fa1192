"""TIDE's objective (policies.objective.tide): every loss term by hand, modality dropout and the
device extras; where the residual adapter learns (`objective.adapter_path`: personal or
joint), by hand and on hosts; and in lock-step (raymm.training.lockstep): weights of ones and
padding rows keep the sequential loss, the loss vmaps over devices with different dropout, and
whole runs agree with the sequential path.

Tolerance of the lock-step runs: 1e-4 absolute on every parameter after four rounds with
prototypes, aux heads, L_cs, modality dropout, the adapter and padded last batches (observed
~1e-7: only float32 summation order differs).
"""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.func import vmap

from policies.objective.tide import (
    TideObjective,
    TideObjectiveParams,
    aux_head_loss,
    cross_sensor_loss,
    prototype_loss,
    prox_global,
)
from raymm.app.api import run
from raymm.app.build import build_world, load_scenario
from raymm.config.schema import EngineSpec, ModelSpec
from raymm.device.host import DeviceHost, HostSpec
from raymm.device.lockstep_host import LockstepHost, make_host
from raymm.models import LOCAL, MultimodalNet
from raymm.models.network import ModelOutput
from raymm.protocol.losses import mean_cross_entropy
from raymm.protocol.messages import Broadcast, RoundPlan
from raymm.protocol.seams import LossInputs, Objective
from raymm.server.server import Server

from helpers import tiny_scenario

LOG_1P_EM2 = math.log1p(math.exp(-2.0))  # -log softmax of a logit 2 against a logit 0
#: lock-step against sequential: every parameter after four rounds (module docstring)
TOL = 1e-4


@pytest.fixture(autouse=True)
def _out_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # run(out=None) writes under ./runs


def test_prox_excludes_the_local_adapter() -> None:
    trainable = {"w": torch.tensor([1.0, 2.0]), "adapter.0.weight": torch.tensor([5.0])}
    anchor = {"w": torch.zeros(2), "adapter.0.weight": torch.zeros(1)}
    assert float(prox_global(trainable, anchor)) == 5.0


def test_aux_head_loss_averages_over_present_sensors() -> None:
    logits = {"a": torch.zeros(1, 2), "b": torch.tensor([[math.log(3.0), 0.0]])}
    y = torch.tensor([0])
    both = aux_head_loss(logits, y, torch.ones(1, 2))
    assert float(both) == pytest.approx((math.log(2) + math.log(4 / 3)) / 2)
    only_a = aux_head_loss(logits, y, torch.tensor([[1.0, 0.0]]))
    assert float(only_a) == pytest.approx(math.log(2))


def test_cross_sensor_loss_by_hand() -> None:
    e = torch.eye(2)  # two samples, orthogonal embeddings, identical across sensors
    # ω = I / 0.5: each row and column is softmax([2, 0]) at its own index
    loss = cross_sensor_loss({"a": e, "b": e.clone()}, torch.ones(2, 2), 0.5)
    assert float(loss) == pytest.approx(LOG_1P_EM2)
    # asymmetric: ω = [[2, 2], [0, 0]]. Rows: softmax([2,2])_0 = softmax([0,0])_1 = ½.
    # Columns: [2, 0] at index 0 → log(1 + e^-2); [2, 0] at index 1 → log(1 + e^2)
    eb = torch.tensor([[1.0, 0.0], [1.0, 0.0]])
    expected = (2 * math.log(2) + math.log1p(math.exp(-2)) + math.log1p(math.exp(2))) / 4
    assert float(cross_sensor_loss({"a": e, "b": eb}, torch.ones(2, 2), 0.5)) == \
        pytest.approx(expected)
    # the pair is left out of a batch where modality dropout zeroed sensor b
    assert float(cross_sensor_loss({"a": e, "b": eb}, torch.tensor([[1.0, 0.0]] * 2), 0.5)) == 0


def test_single_sensor_device_has_zero_cross_sensor_loss_and_gradient() -> None:
    ea = torch.randn(4, 3, requires_grad=True)
    eb = torch.zeros(4, 3)  # the missing sensor's branch
    loss = cross_sensor_loss({"a": ea, "b": eb}, torch.tensor([[1.0, 0.0]] * 4), 0.3)
    assert float(loss.detach()) == 0.0
    loss.backward()
    assert ea.grad is not None and float(ea.grad.abs().sum()) == 0.0


def test_prototype_loss_by_hand() -> None:
    protos = torch.tensor([[1.0, 0.0], [0.0, 1.0], [5.0, 5.0]])
    mask = torch.tensor([1.0, 1.0, 0.0])  # class 2 has no prototype yet
    z = torch.tensor([[3.0, 0.0]])
    assert float(prototype_loss(z, torch.tensor([0]), protos, mask, 0.5)) == \
        pytest.approx(LOG_1P_EM2)
    # a sample of a class without prototype is left out; class 2 is not in the softmax
    z2 = torch.tensor([[3.0, 0.0], [1.0, 1.0]])
    assert float(prototype_loss(z2, torch.tensor([0, 2]), protos, mask, 0.5)) == \
        pytest.approx(LOG_1P_EM2)


def loss_inputs(extras: dict[str, torch.Tensor]) -> LossInputs:
    e = torch.eye(2)
    out = ModelOutput(logits=torch.zeros(2, 2), z=torch.ones(2, 2) * 7,
                      embeddings={"a": e, "b": e.clone()},
                      sensor_logits={"a": torch.zeros(2, 2), "b": torch.zeros(2, 2)},
                      z_base=torch.tensor([[3.0, 0.0], [0.0, 2.0]]))
    return LossInputs(out, torch.tensor([0, 1]), torch.ones(2, 2), ("a", "b"),
                      {"w": torch.tensor([1.0]), "adapter.x": torch.tensor([4.0])},
                      {"w": torch.tensor([0.0]), "adapter.x": torch.tensor([0.0])}, extras, 5)


def test_full_objective_is_the_weighted_sum() -> None:
    p = TideObjectiveParams(mu=0.5, lambda_cs=0.25, lambda_p=2.0, lambda_h=0.1, kappa_c=0.5,
                            kappa_p=0.5)
    obj = TideObjective(p)
    ln2 = math.log(2)
    # task ln 2, prox 1, heads ln 2, cross-sensor log(1+e^-2); no prototypes before warm-up
    before = ln2 + 0.5 * 1.0 + 0.1 * ln2 + 0.25 * LOG_1P_EM2
    assert float(obj.loss(loss_inputs({}))) == pytest.approx(before)
    protos = {"prototypes": torch.eye(2), "prototype_mask": torch.ones(2)}
    # z_base (not the adapted z) against the prototypes: cos = I, logits I/0.5
    assert float(obj.loss(loss_inputs(protos))) == pytest.approx(before + 2.0 * LOG_1P_EM2)
    assert obj.uses_adapter


def test_modality_dropout() -> None:
    xb = {"a": torch.ones(3, 2), "b": torch.ones(3, 2)}
    present = torch.ones(3, 2)
    gen = torch.Generator().manual_seed(0)
    always = TideObjective(TideObjectiveParams(dropout=1.0))
    out, pres = always.augment(xb, present, ("a", "b"), ("a", "b"), gen)
    dropped = [m for m in ("a", "b") if float(out[m].abs().sum()) == 0.0]
    assert len(dropped) == 1
    j = ("a", "b").index(dropped[0])
    assert pres[:, j].tolist() == [0.0] * 3 and pres[:, 1 - j].tolist() == [1.0] * 3
    assert float(xb["a"].sum() + xb["b"].sum()) == 12.0 and float(present.sum()) == 6.0
    # single-sensor devices and dropout 0 are untouched (and draw nothing)
    state = gen.get_state()
    assert always.augment(xb, present, ("a",), ("a", "b"), gen)[0] is xb
    never = TideObjective(TideObjectiveParams(dropout=0.0))
    assert never.augment(xb, present, ("a", "b"), ("a", "b"), gen)[0] is xb
    assert torch.equal(gen.get_state(), state)
    # about a fifth of the batches at the default rate
    rate = TideObjective(TideObjectiveParams())
    g = torch.Generator().manual_seed(1)
    hits = sum(rate.augment(xb, present, ("a", "b"), ("a", "b"), g)[0] is not xb
               for _ in range(2000))
    assert 0.17 < hits / 2000 < 0.23


def test_device_extras_class_means_and_aux_losses() -> None:
    from raymm.config.schema import ModelSpec
    from raymm.models import MultimodalNet

    torch.manual_seed(0)
    spec = ModelSpec(encoder="mlp", embed_dim=2, hidden=3, fusion_dim=4, aux_heads=True,
                     adapter=True)
    model = MultimodalNet(("a", "b"), {"a": (4,), "b": (3,)}, 3, spec)
    xs = {"a": torch.randn(5, 4), "b": torch.zeros(5, 3)}
    y = torch.tensor([0, 2, 0, 2, 2])
    held = torch.tensor([1.0, 0.0])
    obj = TideObjective(TideObjectiveParams(report_aux_loss=True))
    ex = obj.device_extras(model, xs, y, held, True)
    with torch.no_grad():
        out = model(xs, held.expand(5, -1), use_adapter=True)
    assert ex["class_counts"].tolist() == [2, 0, 3]
    np.testing.assert_allclose(ex["class_means"][0], out.z_base[[0, 2]].mean(0), rtol=1e-6)
    np.testing.assert_allclose(ex["class_means"][2], out.z_base[[1, 3, 4]].mean(0), rtol=1e-6)
    np.testing.assert_array_equal(ex["class_means"][1], [0, 0, 0, 0])
    ce = float(torch.nn.functional.cross_entropy(out.sensor_logits["a"], y))
    assert ex["aux_loss"][0] == pytest.approx(ce) and np.isnan(ex["aux_loss"][1])
    assert TideObjective(TideObjectiveParams(lambda_p=0.0)).device_extras(
        model, xs, y, held, True) == {}


# --- where the residual adapter learns (`objective.adapter_path`; docs/methods/tide.md) ---
# `personal` (default): the global parameters learn on the adapter-free path, exactly as the
# server evaluates them; the adapter learns on H̄(z̄ + A(z̄)), which passes no gradient to them.
# `joint` (the earlier rule): the task head is trained on z + A(z).
def _net(seed: int = 0) -> MultimodalNet:
    """Two MLP sensors, aux heads, an adapter whose output layer is no longer zero (as after
    some training): with a zero output layer A(z) = 0 and its Jacobian is 0, so even the joint
    rule would pass no gradient through it and the tests below could not tell the rules apart."""
    torch.manual_seed(seed)
    spec = ModelSpec(encoder="mlp", embed_dim=3, hidden=5, fusion_dim=8, aux_heads=True,
                     adapter=True)
    net = MultimodalNet(("a", "b"), {"a": (4,), "b": (3,)}, 3, spec)
    with torch.no_grad():
        net.adapter[2].weight.normal_(0, 0.5)
        net.adapter[2].bias.normal_(0, 0.5)
    return net


def _batch(n: int = 6) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    xs = {"a": torch.randn(n, 4, generator=g), "b": torch.randn(n, 3, generator=g)}
    return xs, torch.tensor([0, 1, 2, 0, 1, 2][:n]), torch.ones(n, 2)


def _adapter_loss(net: MultimodalNet, obj: TideObjective, **forward: bool) -> torch.Tensor:
    xs, y, present = _batch()
    params = dict(net.named_parameters())
    anchor = {n: p.detach() + 0.05 for n, p in params.items()}
    # prototypes for classes 0 and 2: every term of the objective is active
    extras = {"prototypes": torch.randn(3, 8, generator=torch.Generator().manual_seed(4)),
              "prototype_mask": torch.tensor([1.0, 0.0, 1.0])}
    out = net(xs, present, **forward)
    return obj.loss(LossInputs(out, y, present, ("a", "b"), params, anchor, extras, 12))


def _grads(net: MultimodalNet, loss: torch.Tensor) -> dict[str, torch.Tensor | None]:
    names = [n for n, _ in net.named_parameters()]
    got = torch.autograd.grad(loss, [p for _, p in net.named_parameters()], allow_unused=True)
    return dict(zip(names, got))


def test_default_rule_is_personal_and_joint_stays_selectable() -> None:
    assert TideObjectiveParams().adapter_path == "personal"
    assert TideObjective(TideObjectiveParams()).split_adapter
    assert not TideObjective(TideObjectiveParams(adapter_path="joint")).split_adapter
    assert not TideObjective(TideObjectiveParams(adapter=False)).split_adapter
    sc = load_scenario(tiny_scenario(method="tide", **{"objective.adapter_path": "joint"}))
    assert build_world(sc).host_spec.objective.split_adapter is False
    assert build_world(load_scenario(tiny_scenario(method="tide"))).host_spec.objective \
        .split_adapter is True


def test_personal_logits_are_the_head_on_the_adapted_representation() -> None:
    net = _net()
    xs, _, present = _batch()
    split = net(xs, present, use_adapter=True, split_adapter=True)
    with torch.no_grad():
        z = net.fusion(torch.cat([net.encoders["a"](xs["a"]), net.encoders["b"](xs["b"])], 1))
        own = net.head(z + net.adapter(z))
        torch.testing.assert_close(split.logits, net.head(z), rtol=0, atol=0)
    torch.testing.assert_close(split.personal_logits, own, rtol=0, atol=0)
    # a device predicting for itself (per-device evaluation) gets the same numbers
    torch.testing.assert_close(net(xs, present, use_adapter=True).logits, own, rtol=0, atol=0)
    assert net(xs, present, use_adapter=True).personal_logits is None


def test_loss_adds_the_personal_cross_entropy() -> None:
    net = _net()
    xs, y, present = _batch()
    personal = _adapter_loss(net, TideObjective(TideObjectiveParams()), use_adapter=True,
                     split_adapter=True)
    free = _adapter_loss(net, TideObjective(TideObjectiveParams(adapter=False)))
    with torch.no_grad():
        own = net(xs, present, use_adapter=True).logits
    assert float(personal.detach()) == pytest.approx(
        float(free.detach()) + float(F.cross_entropy(own, y)), rel=1e-6)


def test_global_gradient_equals_the_adapter_free_objective() -> None:
    net = _net()
    got = _grads(net, _adapter_loss(net, TideObjective(TideObjectiveParams()), use_adapter=True,
                            split_adapter=True))
    ref = _grads(net, _adapter_loss(net, TideObjective(TideObjectiveParams(adapter=False))))
    globals_ = [n for n in got if not n.startswith("adapter.")]
    assert len(globals_) > 10
    for n in globals_:
        assert ref[n] is not None and got[n] is not None and torch.equal(got[n], ref[n]), n
    for n in got:
        if n.startswith("adapter."):
            assert ref[n] is None and got[n] is not None and float(got[n].abs().sum()) > 0, n
    # the earlier rule trains the shared head and the encoders through the adapter
    joint = _grads(net, _adapter_loss(net, TideObjective(TideObjectiveParams(adapter_path="joint")),
                              use_adapter=True))
    for n in ("head.weight", "fusion.0.weight", "encoders.a.1.weight"):
        assert not torch.allclose(joint[n], ref[n]), n
    # the aux heads see no adapter under either rule
    assert torch.equal(joint["heads.a.weight"], ref["heads.a.weight"])


class PersonalPathOnly(Objective):
    """Only the personal term of the loss: a step on it must move the adapter and nothing else
    (real trainers, real optimizer, several epochs)."""

    uses_adapter = True
    split_adapter = True
    vectorisable = True

    def loss(self, inp: LossInputs) -> torch.Tensor:
        assert inp.out.personal_logits is not None
        return mean_cross_entropy(inp.out.personal_logits, inp.y, inp.weight)


@pytest.mark.parametrize("lockstep", [False, True], ids=["sequential", "lock-step"])
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_a_step_on_the_personal_path_leaves_every_global_parameter_unchanged(
        lockstep: bool, optimizer: str) -> None:
    sc = load_scenario(tiny_scenario(**{"model.adapter": True, "training.local_epochs": 2,
                                        "training.batch_size": 5, "training.upload": "all",
                                        "training.optimizer": optimizer,
                                        "training.momentum": 0.9 if optimizer == "sgd" else 0,
                                        "execution.training.path":
                                            "lockstep" if lockstep else "sequential"}))
    world = build_world(sc)
    spec = HostSpec(sc.seed, sc.model, sc.training, PersonalPathOnly(),
                    engine=sc.execution.training)
    host = make_host(np.arange(world.population.n), world.population, world.dataset, spec)
    assert isinstance(host, LockstepHost) == lockstep
    server = Server(sc, world.dataset, world.population, world.policies)
    plan = RoundPlan(2, np.array([0, 3, 5, 8, 11]), tuple(server.layout.groups))
    bcast = Broadcast(2, server.params, {})
    for _ in range(2):  # the second round starts from each device's trained adapter
        res = host.train(plan, bcast)
    assert res.failed.size == 0 and res.device_ids.tolist() == plan.selected.tolist()
    for g, rows in res.updates.items():
        for row in rows:
            assert row.tobytes() == server.params[g].tobytes(), g
    initial = host.trainer.initial_local
    for dev in plan.selected.tolist():
        assert not np.array_equal(host.states[dev].adapter, initial), dev


def test_personal_rule_lock_step_matches_sequential_adapters() -> None:
    """The adapters trained on the personal path agree between the two trainers."""
    sc = load_scenario(tiny_scenario(method="tide", **{"training.batch_size": 7,
                                                       "training.lr": 0.01}))
    world = build_world(sc)
    ids = np.arange(world.population.n)
    hosts = [cls(ids, world.population, world.dataset, HostSpec(
        sc.seed, sc.model, sc.training, world.host_spec.objective,
        engine=EngineSpec(path=path))) for cls, path in ((DeviceHost, "sequential"),
                                                         (make_host, "lockstep"))]
    server = Server(sc, world.dataset, world.population, world.policies)
    plan = RoundPlan(2, np.array([0, 3, 4, 7, 9, 11]), tuple(server.layout.groups))
    bcast = Broadcast(2, server.params, {})
    a, b = (h.train(plan, bcast) for h in hosts)
    for g in a.updates:
        np.testing.assert_allclose(b.updates[g], a.updates[g], rtol=0, atol=1e-5)
    for dev in plan.selected.tolist():
        np.testing.assert_allclose(hosts[1].states[dev].adapter, hosts[0].states[dev].adapter,
                                   rtol=0, atol=1e-5)
        assert not np.array_equal(hosts[0].states[dev].adapter, hosts[0].trainer.initial_local)
    assert LOCAL not in a.updates


def test_each_device_evaluates_with_its_own_adapter_on_its_own_test_part() -> None:
    sc = load_scenario(tiny_scenario(**{"model.adapter": True, "training.local_epochs": 3,
                                        "training.optimizer": "adam", "training.lr": 0.05,
                                        "population.local_test_fraction": 0.3}))
    world = build_world(sc)
    host = DeviceHost(np.arange(world.population.n), world.population, world.dataset,
                      HostSpec(sc.seed, sc.model, sc.training, PersonalPathOnly()))
    server = Server(sc, world.dataset, world.population, world.policies)
    plan = RoundPlan(2, np.array([1, 6, 10]), tuple(server.layout.groups))
    host.train(plan, Broadcast(2, server.params, {}))
    ev = host.evaluate_devices(server.eval_payload(3))
    tr, pop = host.trainer, world.population
    for dev in range(pop.n):
        idx = torch.from_numpy(pop.test_indices_of(dev).astype(np.int64))
        held = pop.sensor_mask[dev]
        xs = {m: tr.train_x[m][idx] if h else torch.zeros_like(tr.train_x[m][idx])
              for m, h in zip(pop.sensors, held)}
        present = torch.from_numpy(held.astype(np.float32)).expand(idx.shape[0], -1)

        def loss_with(adapter: np.ndarray, xs: dict = xs, present: torch.Tensor = present,
                      idx: torch.Tensor = idx) -> float:
            tr.layout.load(tr.model, {**server.params, LOCAL: adapter})
            with torch.no_grad():
                logits = tr.model(xs, present, use_adapter=True).logits
            return float(F.cross_entropy(logits, tr.train_y[idx], reduction="sum"))

        own = host.state_of(dev).adapter
        own = tr.initial_local if own is None else own
        assert ev.n_test[dev] == idx.shape[0] > 0
        assert ev.loss_sum[dev] == pytest.approx(loss_with(own), rel=1e-6)
        if dev in plan.selected:  # a trained adapter predicts differently from the identity
            assert ev.loss_sum[dev] != pytest.approx(loss_with(tr.initial_local), rel=1e-6)


# --- in lock-step (raymm.training.lockstep), as on the sequential path --------------------
def _scenario(path: str, adapter_path: str = "personal", mu: float = 0.01) -> dict:
    # batch 7: most devices end an epoch on a padded batch; warm-up 1: prototypes from round 2
    return tiny_scenario(**{"method": "tide", "rounds": 4, "training.lr": 0.01,
                            "training.batch_size": 7, "execution.training.path": path,
                            "aggregation": {"name": "tide", "warmup": 1},
                            "objective.adapter_path": adapter_path, "objective.mu": mu})


# mu 3: lock-step Adam adds the proximal term outside the loss (`LockstepAdam`), and there it
# moves the parameters by far more than the tolerance
@pytest.mark.parametrize("adapter_path,mu", [("personal", 0.01), ("joint", 0.01),
                                             ("personal", 3.0)])
def test_tide_lockstep_matches_sequential(caplog, adapter_path, mu):
    sc = load_scenario(_scenario("lockstep", adapter_path, mu))
    world = build_world(sc)
    host = make_host(np.arange(world.population.n), world.population, world.dataset,
                     world.host_spec)
    assert isinstance(host, LockstepHost) and host.reason is None and host.lockstep is not None
    seq = run(load_scenario(_scenario("sequential", adapter_path, mu)), out=None)
    with caplog.at_level(logging.WARNING, logger="raymm.training.lockstep"):
        vec = run(sc, out=None)
    # no bucket fell back to sequential training
    assert "failed" not in caplog.text and "sequentially" not in caplog.text
    assert seq.params.keys() == vec.params.keys()
    for g in seq.params:
        np.testing.assert_allclose(vec.params[g], seq.params[g], rtol=0, atol=TOL, err_msg=g)
    np.testing.assert_allclose([r["train_loss"] for r in vec.rows],
                               [r["train_loss"] for r in seq.rows], atol=TOL)


def _inputs(weight, b: int = 6, c: int = 4, present=None) -> LossInputs:
    g = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    out = ModelOutput(logits=r(b, c), z=r(b, 5), embeddings={"a": r(b, 3), "b": r(b, 3)},
                      sensor_logits={"a": r(b, c), "b": r(b, c)}, z_base=r(b, 5))
    y = torch.tensor([0, 1, 2, 3, 0, 2][:b])
    extras = {"prototypes": r(c, 5), "prototype_mask": torch.tensor([1.0, 0.0, 1.0, 1.0])}
    w = {"w": r(3)}
    return LossInputs(out, y, torch.ones(b, 2) if present is None else present, ("a", "b"),
                      w, {"w": w["w"] + 0.1}, extras, 3, weight=weight)


def _loss(inp: LossInputs) -> torch.Tensor:
    return TideObjective(TideObjectiveParams(mu=0.5)).loss(inp)


def test_all_ones_weight_is_the_sequential_loss():
    assert TideObjective.vectorisable
    ref = _loss(_inputs(None))
    torch.testing.assert_close(_loss(_inputs(torch.ones(6))), ref, rtol=0, atol=1e-6)


def _pad(inp: LossInputs, k: int, present_pad: float = 1.0) -> LossInputs:
    """`inp` with k junk rows appended, weight 0."""
    g = torch.Generator().manual_seed(1)
    cat = lambda t: torch.cat([t, 10 * torch.randn((k,) + t.shape[1:], generator=g)])  # noqa
    o = inp.out
    out = ModelOutput(cat(o.logits), cat(o.z), {m: cat(e) for m, e in o.embeddings.items()},
                      {m: cat(s) for m, s in o.sensor_logits.items()}, cat(o.z_base))
    y = torch.cat([inp.y, torch.tensor([1] * k)])
    present = torch.cat([inp.present, torch.full((k, 2), present_pad)])
    weight = torch.cat([torch.ones(inp.y.shape[0]), torch.zeros(k)])
    return LossInputs(out, y, present, inp.held, inp.trainable, inp.anchor, inp.extras,
                      inp.round, weight=weight)


def test_padding_rows_do_not_change_the_loss_or_its_terms():
    ref = _loss(_inputs(None, b=4))
    torch.testing.assert_close(_loss(_pad(_inputs(None, b=4), 3)), ref, rtol=0, atol=1e-5)
    # a sensor dropped in the real rows but "present" on padding still counts as dropped
    dropped = torch.tensor([[1.0, 0.0]] * 4)
    ref = _loss(_inputs(None, b=4, present=dropped))
    torch.testing.assert_close(_loss(_pad(_inputs(None, b=4, present=dropped), 3)), ref,
                               rtol=0, atol=1e-5)
    # and padding rows marked absent do not drop a sensor the real rows have
    ref = _loss(_inputs(None, b=4))
    torch.testing.assert_close(_loss(_pad(_inputs(None, b=4), 3, present_pad=0.0)), ref,
                               rtol=0, atol=1e-5)


def test_loss_vmaps_over_devices_with_different_dropout():
    """Two devices in one bucket, one with sensor b dropped: each gets its own loss."""
    both, drop = _pad(_inputs(None, b=4), 2), _pad(_inputs(None, b=4), 2)
    drop_present = drop.present.clone()
    drop_present[:4, 1] = 0.0
    f = lambda pr, w: _loss(LossInputs(both.out, both.y, pr, both.held, both.trainable,  # noqa
                                       both.anchor, both.extras, 3, weight=w))
    got = vmap(f)(torch.stack([both.present, drop_present]), torch.stack([both.weight] * 2))
    torch.testing.assert_close(got[0], _loss(_inputs(None, b=4)), rtol=0, atol=1e-5)
    torch.testing.assert_close(
        got[1], _loss(_inputs(None, b=4, present=torch.tensor([[1.0, 0.0]] * 4))),
        rtol=0, atol=1e-5)
    assert not torch.isclose(got[0], got[1])
