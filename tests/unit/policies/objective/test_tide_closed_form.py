"""TIDE's loss after the encoders in closed form (`policies/objective/tide_closed_form.py`):
the loss and every gradient that autograd gives through `TideObjective.loss` under `vmap`, in
every configuration it takes, and runs that use it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import policies.objective.tide_closed_form as tide_closed_form
from policies.objective.tide import TideObjective, TideObjectiveParams
from raymm.app.api import run
from raymm.app.build import load_scenario
from raymm.config.schema import ModelSpec, TrainingSpec
from raymm.models.network import MultimodalNet
from raymm.protocol.fast_paths import ClosedFormLoss, closed_form_for
from raymm.training._kernels.module_call import ModuleCall
from raymm.training.local_update import Batch, LocalUpdate
from raymm.training.lockstep.trainer import STEPPERS

from helpers import tiny_scenario

TOL = 1e-5
G, B, E, C = 5, 7, 6, 4


def _net(sensors: tuple[str, ...], adapter: bool = True, aux: bool = True) -> MultimodalNet:
    torch.manual_seed(0)
    return MultimodalNet(sensors, {m: (8,) for m in sensors}, C,
                         ModelSpec(encoder="mlp", embed_dim=E, hidden=10, fusion_dim=12,
                                   aux_heads=aux, adapter=adapter))


def _case(sensors: tuple[str, ...], *, zero_row: bool = False, absent: bool = False,
          mask: tuple[float, ...] = (1.0, 0.0, 1.0, 1.0)) -> dict:
    gen = torch.Generator().manual_seed(3)
    weight = torch.ones(G, B)
    weight[1, 4:] = 0.0          # a short last minibatch
    weight[4, 1:] = 0.0          # one real row
    present = torch.ones(G, B, len(sensors))
    if absent:                   # modality dropout: a sensor zeroed in a whole batch
        present[2, :, 0] = 0.0
        present[3, :4, -1] = 0.0   # absent in real rows only of some: not "present"
    emb = {m: torch.randn(G, B, E, generator=gen).relu() for m in sensors}
    if zero_row:                 # an all-zero embedding: F.normalize's floor
        emb[sensors[0]][0, 2] = 0.0
    return {"emb": emb, "y": torch.randint(C, (G, B), generator=gen), "present": present,
            "weight": weight,
            "extras": {"prototypes": torch.randn(C, 12, generator=gen),
                       "prototype_mask": torch.tensor(mask)}}


def _closed(objective: TideObjective, model: MultimodalNet, trained: list[str],
            use_adapter: bool) -> ClosedFormLoss | None:
    """The loss after the encoders a lock-step program finds registered for TIDE."""
    fast = closed_form_for(objective)
    assert fast is not None and fast.after_encoders is not None
    return fast.after_encoders(objective, model, trained, use_adapter)


def _stacked(model: MultimodalNet, scale: float = 0.2) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    return {n: p.detach() + scale * torch.randn((G, *p.shape), generator=gen)
            for n, p in model.named_parameters() if not n.startswith("encoders.")}


def _autograd(model, objective, params, case, use_adapter: bool):
    """Loss and gradients (parameters, then embeddings) of `TideObjective.loss` as a lock-step
    program takes them: the loss under vmap, one reverse pass."""
    sensors = tuple(case["emb"])
    update = LocalUpdate(ModuleCall(model), objective, TrainingSpec(optimizer="adam"),
                         use_adapter=use_adapter, held=sensors, extras=case["extras"],
                         round=3, groups=(), steppers=STEPPERS)
    leaves = {n: p.clone().requires_grad_(True) for n, p in params.items()}
    emb = {m: e.clone().requires_grad_(True) for m, e in case["emb"].items()}
    x = {m: torch.zeros(G, B, 8) for m in sensors}
    batch = Batch(x, case["y"], case["present"], case["weight"], {})
    loss = torch.vmap(lambda p, bt, em: update.loss(p, {}, {}, {}, bt, em))(leaves, batch, emb)
    found = torch.autograd.grad(loss.sum(), [*leaves.values(), *emb.values()],
                                allow_unused=True)
    return (loss.detach(), dict(zip(leaves, found[:len(leaves)])),
            dict(zip(emb, found[len(leaves):])))


CONFIGS = {
    "default": ({}, {}),
    "no-adapter": ({"adapter": False}, {}),
    "no-aux-loss": ({"lambda_h": 0.0}, {}),
    "no-cross-sensor": ({"lambda_cs": 0.0}, {}),
    "no-prototypes-yet": ({}, {"extras": {}}),
    "all-prototypes": ({}, {"mask": (1.0, 1.0, 1.0, 1.0)}),
    "zero-embedding": ({}, {"zero_row": True}),
    "sensors-absent": ({}, {"absent": True}),
    "three-sensors": ({"kappa_c": 0.5, "lambda_cs": 0.4}, {"sensors": ("a", "b", "c"),
                                                           "absent": True}),
    "one-sensor": ({}, {"sensors": ("a",)}),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_the_closed_form_is_autograd_through_the_tide_loss(name):
    params_kw, case_kw = CONFIGS[name]
    sensors = case_kw.pop("sensors", ("a", "b"))
    extras = case_kw.pop("extras", None)
    case = _case(sensors, **case_kw)
    if extras is not None:
        case["extras"] = extras
    objective = TideObjective(TideObjectiveParams(**params_kw))
    model = _net(sensors)
    params = _stacked(model)
    use_adapter = objective.uses_adapter
    if not use_adapter:
        params = {n: p for n, p in params.items() if not n.startswith("adapter.")}
    closed = _closed(objective, model, list(params), use_adapter)
    assert closed is not None
    ref_loss, ref_params, ref_emb = _autograd(model, objective, params, case, use_adapter)
    with torch.no_grad():
        loss, grads, d_emb = closed(params, case["emb"], case["y"], case["present"],
                                    case["weight"], case["extras"])
    torch.testing.assert_close(loss, ref_loss, rtol=0, atol=1e-6)
    # a parameter the loss does not read has no gradient on either side
    assert set(grads) == {n for n, g in ref_params.items() if g is not None}
    # relative as well: an all-zero embedding row (a ReLU output) meets F.normalize's floor of
    # 1e-12, and its gradient is of order 1e12
    for n, g in grads.items():
        torch.testing.assert_close(g, ref_params[n], rtol=1e-5, atol=TOL, msg=n)
    for m in sensors:
        torch.testing.assert_close(d_emb[m], ref_emb[m], rtol=1e-5, atol=TOL, msg=m)


def test_what_the_closed_form_does_not_cover_keeps_autograd():
    model = _net(("a", "b"))
    names = [n for n, _ in model.named_parameters()]
    joint = TideObjective(TideObjectiveParams(adapter_path="joint"))
    assert _closed(joint, model, names, True) is None
    untrained_heads = [n for n in names if not n.startswith("heads.")]
    assert _closed(TideObjective(TideObjectiveParams()), model, untrained_heads, True) is None
    logit_fusion = MultimodalNet(("a", "b"), {"a": (8,), "b": (8,)}, C,
                                 ModelSpec(encoder="mlp", fusion="sum_logits"))
    every = [n for n, _ in logit_fusion.named_parameters()]
    assert _closed(TideObjective(TideObjectiveParams(adapter=False)), logit_fusion, every,
                   False) is None


@pytest.fixture(autouse=True)
def _out_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # run(out=None) writes under ./runs


def _tide(**overrides) -> tuple[dict[str, np.ndarray], list[float]]:
    # batch 7: padded last batches; warm-up 1: prototypes from round 2; cnn1d encoders
    sc = tiny_scenario(**{
        "method": "tide", "rounds": 4, "training.lr": 0.01, "training.batch_size": 7,
        "aggregation": {"name": "tide", "warmup": 1},
        "dataset.sensors": {"a": {"dim": 3, "length": 32, "informativeness": 1.0},
                            "b": {"dim": 2, "length": 32, "informativeness": 0.5}},
        "model.encoder": "cnn1d", **overrides})
    res = run(load_scenario(sc), out=None)
    return res.params, [r["train_loss"] for r in res.rows]


@pytest.mark.parametrize("optimizer", [{}, {"training.optimizer": "sgd",
                                            "training.momentum": 0.9, "objective.mu": 0.5}],
                         ids=["adam", "sgd-prox-in-the-loss"])
def test_a_tide_run_in_closed_form_is_the_autograd_run(monkeypatch, optimizer):
    calls = []
    step = tide_closed_form.TideClosedForm.__call__

    def counted(self, *args):
        calls.append(1)
        return step(self, *args)
    monkeypatch.setattr(tide_closed_form.TideClosedForm, "__call__", counted)
    hand, hand_loss = _tide(**optimizer)
    used = len(calls)
    auto, auto_loss = _tide(**optimizer, **{"execution.training.closed_form": False})
    assert used > 0 and len(calls) == used
    for grp in hand:
        np.testing.assert_allclose(hand[grp], auto[grp], rtol=0, atol=1e-4, err_msg=grp)
    np.testing.assert_allclose(hand_loss, auto_loss, rtol=0, atol=1e-5)
