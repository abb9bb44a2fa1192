"""The lock-step gradient written out by hand (`raymm.training.lockstep.closed_form`): which
models and losses it takes, and that it gives autograd's numbers, the sequential path's, and
the same bits in every packing."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import raymm.training.lockstep.closed_form as closed_form
from policies.objective.ce import CEParams, CrossEntropy
from policies.objective.tide import TideObjective, TideObjectiveParams
from raymm.app.api import run
from raymm.app.build import load_scenario
from raymm.config.schema import ModelSpec, TrainingSpec
from raymm.models.network import MultimodalNet
from raymm.training._kernels.module_call import ModuleCall
from raymm.training.local_update import Batch, LocalUpdate
from raymm.training.lockstep.closed_form import closed_form_grads, linear_chain
from raymm.training.lockstep.gradients import vmap_autograd

from helpers import tiny_scenario
from needs import needs_batch_invariant_matmul

TOL = 1e-5


def _net(encoder: str = "identity", sensors: tuple[str, ...] = ("a",), **spec) -> MultimodalNet:
    torch.manual_seed(0)
    return MultimodalNet(sensors, {m: (8,) for m in sensors}, 4,
                         ModelSpec(encoder=encoder, embed_dim=6, hidden=10, fusion_dim=12,
                                   **spec))


def test_the_chain_of_an_mlp_model_is_its_linear_layers_in_order():
    sensor, layers = linear_chain(_net("mlp"))
    assert sensor == "a"
    assert [(d.weight, d.relu) for d in layers] == [
        ("encoders.a.1.weight", True), ("encoders.a.3.weight", True),
        ("fusion.0.weight", True), ("head.weight", False)]
    assert [d.weight for d in linear_chain(_net("identity"))[1]] == ["fusion.0.weight",
                                                                      "head.weight"]


@pytest.mark.parametrize("net", [
    lambda: _net("identity", ("a", "b")),          # two sensors: a concatenation
    lambda: _net("identity", aux_heads=True),      # per-sensor heads
    lambda: MultimodalNet(("a",), {"a": (16, 3)}, 4, ModelSpec(encoder="cnn1d")),
], ids=["two-sensors", "aux-heads", "cnn1d"])
def test_a_model_that_is_not_one_linear_chain_keeps_autograd(net):
    model = net()
    assert linear_chain(model) is None
    params = {n: p.detach().unsqueeze(0) for n, p in model.named_parameters()}
    assert closed_form_grads(model, CrossEntropy(CEParams()), params, params,
                             proximal=(0.0, ()), plain=True) is None


class _Subclass(CrossEntropy):
    """Not registered: a subclass may change `loss`, so it does not inherit `ce`'s step."""

def test_a_loss_other_than_cross_entropy_keeps_autograd():
    model = _net()
    params = {n: p.detach().unsqueeze(0) for n, p in model.named_parameters()}
    assert closed_form_grads(model, CrossEntropy(CEParams()), params, params,
                             proximal=(0.0, ()), plain=True) is not None
    tide = TideObjective(TideObjectiveParams(adapter=False))
    for objective in (tide, CrossEntropy(CEParams(adapter=True)), _Subclass(CEParams())):
        assert closed_form_grads(model, objective, params, params, proximal=(0.0, ()),
                                 plain=True) is None, objective
    assert closed_form_grads(model, CrossEntropy(CEParams()), params, params,
                             proximal=(0.0, ()), plain=False) is None


def _stacked(model: MultimodalNet, g: int, scale: float) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    return {n: p.detach() + scale * torch.randn((g, *p.shape), generator=gen)
            for n, p in model.named_parameters()}


@pytest.mark.parametrize("encoder", ["identity", "mlp"])
@pytest.mark.parametrize("mu", [0.0, 0.4])
def test_the_closed_form_gives_autograds_loss_and_gradients(encoder, mu):
    model = _net(encoder)
    objective = CrossEntropy(CEParams(mu=mu))
    g, k, b = 6, 4, 5
    anchor = _stacked(model, g, 0.3)
    params = {n: a[:k] + 0.05 * torch.randn_like(a[:k]) for n, a in anchor.items()}
    gen = torch.Generator().manual_seed(2)
    weight = torch.ones(k, b)
    weight[1, 3:] = 0.0   # a short last minibatch: padding rows count nowhere
    weight[3, 1:] = 0.0
    batch = Batch({"a": torch.randn(k, b, 8, generator=gen)},
                  torch.randint(4, (k, b), generator=gen), torch.ones(k, b, 1), weight)
    update = LocalUpdate(ModuleCall(model), objective, TrainingSpec(), use_adapter=False,
                         held=("a",), extras={}, round=1, groups=("sensor:a", "shared"))
    ref_loss, ref = vmap_autograd(update, update.call, anchor, {}, {}, {})(params, batch)
    hand = closed_form_grads(model, objective, params, anchor,
                             proximal=objective.proximal(list(params)), plain=True)
    assert hand is not None
    loss, got = hand(params, batch)
    torch.testing.assert_close(loss, ref_loss, rtol=0, atol=TOL)
    assert got.keys() == ref.keys()
    for n in ref:
        torch.testing.assert_close(got[n], ref[n], rtol=0, atol=TOL, msg=n)
        assert got[n].shape == params[n].shape


def _one_sensor(**overrides) -> dict:
    return tiny_scenario(**{
        "dataset.sensors": {"a": {"dim": 8, "informativeness": 1.0}},
        "population.tiers": [{"sensors": ["a"], "count": 12}],
        "selection.k": 8, "training.batch_size": 7, **overrides})


def _final(monkeypatch, **overrides) -> tuple[dict[str, np.ndarray], list[float], int]:
    calls = []
    step = closed_form._chain_step

    def counted(*args):
        calls.append(1)
        return step(*args)
    monkeypatch.setattr(closed_form, "_chain_step", counted)
    res = run(load_scenario(_one_sensor(**overrides)), out=None)
    return res.params, [r["train_loss"] for r in res.rows], len(calls)


@pytest.fixture(autouse=True)
def _out_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # run(out=None) writes under ./runs


@pytest.mark.parametrize("extra", [
    {"model.encoder": "identity"},
    {"model.encoder": "mlp", "training.momentum": 0.9, "training.local_epochs": 2},
    {"model.encoder": "mlp", "objective": {"name": "ce", "mu": 0.5}},
    {"model.encoder": "mlp", "objective": {"name": "ce", "mu": 0.5},
     "training.optimizer": "adam", "training.lr": 0.01},
], ids=["identity", "mlp-momentum-2-epochs", "mlp-fedprox", "mlp-fedprox-adam"])
def test_a_run_in_closed_form_is_the_autograd_and_the_sequential_run(monkeypatch, extra):
    hand, hand_loss, used = _final(monkeypatch, **extra)
    auto, auto_loss, unused = _final(monkeypatch, **extra,
                                     **{"execution.training.closed_form": False})
    seq, seq_loss, _ = _final(monkeypatch, **extra, **{"execution.training.path": "sequential"})
    assert used > 0 and unused == 0
    for other, other_loss in [(auto, auto_loss), (seq, seq_loss)]:
        assert other.keys() == hand.keys()
        for grp in hand:
            np.testing.assert_allclose(hand[grp], other[grp], rtol=0, atol=TOL, err_msg=grp)
        np.testing.assert_allclose(hand_loss, other_loss, rtol=0, atol=TOL)


@needs_batch_invariant_matmul
def test_a_devices_closed_form_numbers_do_not_depend_on_the_packing(monkeypatch):
    base = {"model.encoder": "mlp", "training.local_epochs": 2, "training.momentum": 0.9}
    ref, _, used = _final(monkeypatch, **base)
    assert used > 0
    for per, chunk in [(1, 512), (5, 2), (3, 1)]:
        got, _, _ = _final(monkeypatch, **base, **{"execution.devices_per_actor": per,
                                                   "execution.training.chunk": chunk})
        for grp in ref:
            assert np.array_equal(got[grp], ref[grp]), (per, chunk, grp)
