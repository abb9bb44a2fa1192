"""Where TIDE's residual adapter learns (`objective.adapter_path`; docs/methods/tide.md).

`personal` (default): the global parameters learn on the adapter-free path, exactly as the
server evaluates them; the adapter learns on H̄(z̄ + A(z̄)), which passes no gradient to them.
`joint` (the earlier rule): the task head is trained on z + A(z).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from policies.objective.tide import TideObjective, TideObjectiveParams
from raymm.app.build import build_world, load_scenario
from raymm.config.schema import EngineSpec, ModelSpec
from raymm.device.host import DeviceHost, HostSpec
from raymm.device.lockstep_host import LockstepHost, make_host
from raymm.models import LOCAL, MultimodalNet
from raymm.protocol.losses import mean_cross_entropy
from raymm.protocol.messages import Broadcast, RoundPlan
from raymm.protocol.seams import LossInputs, Objective
from raymm.server.server import Server

from helpers import tiny_scenario


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


def _loss(net: MultimodalNet, obj: TideObjective, **forward: bool) -> torch.Tensor:
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
    personal = _loss(net, TideObjective(TideObjectiveParams()), use_adapter=True,
                     split_adapter=True)
    free = _loss(net, TideObjective(TideObjectiveParams(adapter=False)))
    with torch.no_grad():
        own = net(xs, present, use_adapter=True).logits
    assert float(personal.detach()) == pytest.approx(
        float(free.detach()) + float(F.cross_entropy(own, y)), rel=1e-6)


def test_global_gradient_equals_the_adapter_free_objective() -> None:
    net = _net()
    got = _grads(net, _loss(net, TideObjective(TideObjectiveParams()), use_adapter=True,
                            split_adapter=True))
    ref = _grads(net, _loss(net, TideObjective(TideObjectiveParams(adapter=False))))
    globals_ = [n for n in got if not n.startswith("adapter.")]
    assert len(globals_) > 10
    for n in globals_:
        assert ref[n] is not None and got[n] is not None and torch.equal(got[n], ref[n]), n
    for n in got:
        if n.startswith("adapter."):
            assert ref[n] is None and got[n] is not None and float(got[n].abs().sum()) > 0, n
    # the earlier rule trains the shared head and the encoders through the adapter
    joint = _grads(net, _loss(net, TideObjective(TideObjectiveParams(adapter_path="joint")),
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
