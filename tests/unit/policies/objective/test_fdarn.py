"""FDARN's loss (policies.objective.fdarn), by hand: the orthogonality of the codes (the
difference loss mean((P̃ᵀS̃)²)), the gradient-reversal layer, one ArcFace logit and the
spread of the class weights; then the network's private branch and discriminator
(`model.private: [branch]`, `model.discriminator`) and the whole loss on it."""

from __future__ import annotations

import math

import pytest
import torch

from policies.objective.fdarn import (
    FDARN,
    FDARNParams,
    arcface_logits,
    grl_coefficient,
    modality_labels,
    orthogonality,
    reverse_gradient,
    spread_out,
)
from raymm.config.schema import ModelSpec
from raymm.models.layout import PRIVATE, GroupLayout
from raymm.models.network import SHARED, MultimodalNet, code_of
from raymm.protocol.seams import LossInputs


def test_orthogonality_of_the_survey_case() -> None:
    # P̃ = I, S̃ = [[1,0],[1,0]] (rows already unit): P̃ᵀS̃ = [[1,0],[1,0]], mean of squares 0.5
    p = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    s = torch.tensor([[1.0, 0.0], [1.0, 0.0]])
    assert orthogonality(p, s).item() == pytest.approx(0.5, abs=1e-5)
    # the rows are scaled to unit length first: the same with longer rows
    assert orthogonality(3 * p, 2 * s).item() == pytest.approx(0.5, abs=1e-5)
    # a padding row (weight 0) does not count: outer([1,0],[1,0]) alone -> 1/4
    assert orthogonality(p, s, torch.tensor([1.0, 0.0])).item() == pytest.approx(0.25,
                                                                                  abs=1e-5)


def test_gradient_reversal_is_identity_forward_and_minus_coef_backward() -> None:
    x = torch.tensor([1.0, -2.0], requires_grad=True)
    y = reverse_gradient(x, 0.3)
    assert torch.equal(y, x.detach())
    (y * torch.tensor([2.0, 5.0])).sum().backward()
    assert x.grad is not None
    assert x.grad.tolist() == pytest.approx([-0.6, -1.5])


def test_gradient_reversal_runs_under_vmap() -> None:
    def f(v: torch.Tensor) -> torch.Tensor:
        return (reverse_gradient(v, 0.5) * 3.0).sum()
    g = torch.func.vmap(torch.func.grad(f))(torch.ones(4, 2))
    assert torch.equal(g, torch.full((4, 2), -1.5))


def test_reversal_coefficient_schedule() -> None:
    assert grl_coefficient(0.0) == 0.0
    assert grl_coefficient(1.0) == pytest.approx(2 / (1 + math.exp(-10)) - 1)   # 0.99991
    assert grl_coefficient(0.1) == pytest.approx(0.462117, abs=1e-6)   # 2/(1+e^-1) - 1


def test_one_arcface_logit_by_hand() -> None:
    # feature (0.6, 0.8), class weights e1, e2: cos θ = (0.6, 0.8); label 0:
    # s·cos(θ0 + m) = 72·(0.6·cos 0.5 − 0.8·sin 0.5) = 72·(0.5265496 − 0.3835404) = 10.29666
    w = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    out = arcface_logits(torch.tensor([[0.6, 0.8]]), w, torch.tensor([0]), 72.0, 0.5)
    assert out[0, 0].item() == pytest.approx(10.29666, abs=1e-4)
    assert out[0, 1].item() == pytest.approx(72 * 0.8, rel=1e-6)   # the other class: s·cos θ1
    # θ0 + m past π (cos θ0 = −1 ≤ cos(π − m)): s·(cos θ0 − m·sin m) = 72·(−1 − 0.2397128)
    far = arcface_logits(torch.tensor([[-1.0, 0.0]]), w, torch.tensor([0]), 72.0, 0.5)
    assert far[0, 0].item() == pytest.approx(-89.25932, abs=1e-3)


def test_spread_of_the_class_weights() -> None:
    # ŵ = (1, 0), (1, 1)/√2: the one pair's cosine² is 1/2, over 2 ordered pairs / (2·1)
    assert spread_out(torch.tensor([[1.0, 0.0], [1.0, 1.0]])).item() == pytest.approx(0.5)
    assert spread_out(torch.eye(3)).item() == 0.0


def test_modality_labels_are_sensor_sets() -> None:
    present = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    assert modality_labels(present).tolist() == [0, 1, 2]


SHAPES = {"a": (5,), "b": (5,)}


def fdarn_net(fusion: str = "concat") -> MultimodalNet:
    torch.manual_seed(0)
    spec = ModelSpec(encoder="mlp", embed_dim=4, hidden=6, fusion_dim=3, fusion=fusion,
                     private=["branch"], discriminator=8)
    return MultimodalNet(("a", "b"), SHAPES, 3, spec)


@pytest.mark.parametrize("fusion", ["concat", "sum_logits"])
def test_branch_is_private_and_discriminator_shared(fusion: str) -> None:
    net = fdarn_net(fusion)
    layout = GroupLayout(net)
    private = {s.name for s in layout.slots[PRIVATE]}
    assert private and all(n.startswith("branch.") for n in private)
    shared = {s.name for s in layout.slots[SHARED]}
    assert {"discriminator.layer.weight", "discriminator.arc"} <= shared
    assert PRIVATE not in layout.groups   # it never travels
    x = {m: torch.randn(4, 5) for m in SHAPES}
    present = torch.tensor([[1.0, 1.0], [1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    out = net(x, present)
    # the prediction: the shared network's logits plus the private branch's
    assert net.branch is not None
    masked = {m: x[m] * present[:, j:j + 1] for j, m in enumerate(SHAPES)}
    own = net.branch(masked, present)
    net.branch, branch = None, net.branch
    alone = net(x, present)
    net.branch = branch
    assert torch.allclose(out.logits, alone.logits + own.logits)
    width = 3 if fusion == "concat" else 8   # fusion_dim, or both sensors' embeddings
    assert out.private_code is not None and out.private_code.shape == (4, width)
    assert code_of(out.z_base, out.embeddings, present).shape == (4, width)


def test_the_whole_loss_is_its_terms() -> None:
    net = fdarn_net()
    x = {m: torch.randn(4, 5) for m in SHAPES}
    present = torch.tensor([[1.0, 1.0], [1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    y = torch.tensor([0, 1, 2, 0])
    out = net(x, present)
    params = dict(net.named_parameters())
    obj = FDARN(FDARNParams())
    obj.rounds = 10
    loss = obj.loss(LossInputs(out, y, present, ("a", "b"), params, {}, round=5))
    s, p = out.z_base, out.private_code
    assert s is not None and p is not None
    d = modality_labels(present)
    disc = net.discriminator
    assert disc is not None

    def dom(code: torch.Tensor) -> torch.Tensor:
        feat = torch.relu(disc.layer(code))
        return torch.nn.functional.cross_entropy(arcface_logits(feat, disc.arc, d, 72, 0.5), d)

    expect = torch.nn.functional.cross_entropy(out.logits, y) + 0.6 * orthogonality(p, s) \
        + 0.4 * dom(p) + 0.4 * dom(s) + 0.4 * spread_out(disc.arc)
    assert loss.item() == pytest.approx(expect.item(), rel=1e-5)
    # the shared encoder's gradient from the adversarial term is reversed: with only that
    # term, ∂/∂s = −c·∂CE/∂s, c = 2/(1+e^-5) − 1 at round 5 of 10
    adv_only = FDARN(FDARNParams(diff_weight=0, domain_weight=0, spread_weight=0))
    adv_only.rounds = 10
    s_leaf = s.detach().requires_grad_(True)
    out2 = type(out)(out.logits.detach() * 0, s_leaf, out.embeddings, {}, s_leaf,
                     private_code=p.detach())
    (adv_only.loss(LossInputs(out2, y, present, ("a", "b"), params, {}, round=5))
     - torch.nn.functional.cross_entropy(out2.logits, y)).backward()
    s_ref = s.detach().requires_grad_(True)
    (0.4 * dom(s_ref)).backward()
    c = 2 / (1 + math.exp(-5)) - 1
    assert s_leaf.grad is not None and s_ref.grad is not None
    assert torch.allclose(s_leaf.grad, -c * s_ref.grad, atol=1e-6)


def test_scenario_without_branch_is_refused() -> None:
    from raymm.app.build import load_scenario

    from helpers import tiny_scenario
    sc = load_scenario(tiny_scenario())
    assert FDARN.check_scenario(FDARNParams(), sc, None)


@pytest.mark.parametrize("fusion", ["concat", "sum_logits"])
def test_lockstep_trains_as_the_sequential_path(fusion: str, tmp_path, monkeypatch) -> None:
    from helpers import tiny_run_params
    monkeypatch.chdir(tmp_path)
    kw = {"method": "fdarn", "eval.scope": "devices", "model.fusion": fusion}
    seq, seq_rows = tiny_run_params({**kw, "execution.training.path": "sequential"})
    vec, vec_rows = tiny_run_params({**kw, "execution.training.path": "lockstep"})
    assert seq.keys() == vec.keys()
    for g in seq:
        assert seq[g] == pytest.approx(vec[g], abs=2e-5), g
    assert [r["train_loss"] for r in seq_rows] == pytest.approx(
        [r["train_loss"] for r in vec_rows], rel=1e-4)


def test_reversal_reaches_full_strength_after_grl_rounds() -> None:
    from raymm.app.build import load_scenario

    from helpers import tiny_scenario
    sc = load_scenario(tiny_scenario(method="fdarn", rounds=100, **{"eval.scope": "devices"}))
    obj = FDARN(FDARNParams(grl_rounds=10))
    obj.bind(sc, ("a", "b"))
    assert obj.coefficient(5) == pytest.approx(2 / (1 + math.exp(-5)) - 1)
    assert obj.coefficient(50) == obj.coefficient(10)
    whole = FDARN(FDARNParams())
    whole.bind(sc, ("a", "b"))
    assert whole.coefficient(50) == pytest.approx(obj.coefficient(5))
