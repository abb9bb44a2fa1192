"""MCFT stage objective: alignment (InfoNCE), complementarity weights and the gated sum."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from policies.objective.mcft import MCFTParams, MCFTStage, complementarity_weights, info_nce
from raymm.errors import ScenarioError
from raymm.models.network import ModelOutput
from raymm.protocol.seams import LossInputs


def test_info_nce_hand_computed() -> None:
    a = torch.tensor([[1.0, 0.0], [0.0, 2.0]])      # normalised: e1, e2
    c = torch.tensor([[3.0, 0.0], [0.0, 1.0]])
    # cos = identity; τ = 1: each row -log(e / (e + 1)) = log(1 + e^-1)
    assert info_nce(a, c, 1.0).item() == pytest.approx(math.log(1 + math.exp(-1)), abs=1e-6)
    # τ = 0.5 doubles the logits
    assert info_nce(a, c, 0.5).item() == pytest.approx(math.log(1 + math.exp(-2)), abs=1e-6)
    # swapped candidates: the positives are now orthogonal, the negatives aligned
    assert info_nce(a, c.flip(0), 1.0).item() == pytest.approx(math.log(1 + math.e), abs=1e-6)


def test_complementarity_weights_hand_computed() -> None:
    z = torch.tensor([[0.0, 0.0], [math.log(3.0), 0.0], [0.0, math.log(3.0)]],
                     requires_grad=True)
    y = torch.tensor([0, 0, 0])
    e = complementarity_weights(z, y)
    # softmax(z)[y] = 0.5, 0.75, 0.25 -> e = 0.5, 0.25, 0.75
    torch.testing.assert_close(e, torch.tensor([0.5, 0.25, 0.75]))
    assert not e.requires_grad


def _inputs(held: tuple[str, ...], groups: tuple[str, ...]) -> tuple[LossInputs, dict]:
    g = torch.Generator().manual_seed(0)
    emb = {m: torch.randn(4, 3, generator=g, requires_grad=True) for m in ("a", "v")}
    logits = {m: torch.randn(4, 5, generator=g, requires_grad=True) for m in ("a", "v")}
    y = torch.tensor([0, 1, 2, 3])
    out = ModelOutput(logits["a"] + logits["v"], None, emb, logits)
    return LossInputs(out, y, torch.ones(4, 2), held, {}, {}, groups=groups), \
        {"emb": emb, "logits": logits, "y": y}


def _stage(**kw: float) -> MCFTStage:
    obj = MCFTStage(MCFTParams(**kw))
    obj.bind(SimpleNamespace(schedule=SimpleNamespace(
        name="modality_chain", params=lambda: {"chain": ["a", "v"]})), ("a", "v"))
    return obj


def test_stage_loss_adds_alignment_and_complementarity_for_preceding_modalities() -> None:
    inp, t = _inputs(("a", "v"), ("sensor:v",))
    loss = _stage(lambda_a=0.4, lambda_c=1.0, tau=0.1).loss(inp)
    y = t["y"]
    ce = F.cross_entropy(t["logits"]["v"], y, reduction="none")
    p_prev = torch.softmax(t["logits"]["a"].detach(), 1)[torch.arange(4), y]
    ha = F.normalize(t["emb"]["a"].detach(), dim=1)
    hv = F.normalize(t["emb"]["v"], dim=1)
    r_a = F.cross_entropy(hv @ ha.T / 0.1, torch.arange(4))
    expected = ce.mean() + 0.4 * r_a + 1.0 * ((1 - p_prev) * ce).mean()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)
    loss.backward()
    # the frozen (preceding) modality gets no gradient, through neither term
    assert t["emb"]["a"].grad is None and t["logits"]["a"].grad is None
    assert t["emb"]["v"].grad is not None


@pytest.mark.parametrize("held,groups", [(("v",), ("sensor:v",)),      # no preceding held
                                         (("a", "v"), ("sensor:a",))])  # first phase
def test_stage_loss_is_plain_ce_without_preceding_modalities(held: tuple, groups: tuple) -> None:
    inp, t = _inputs(held, groups)
    m = groups[0].split(":")[1]
    loss = _stage().loss(inp)
    assert loss.item() == pytest.approx(F.cross_entropy(t["logits"][m], t["y"]).item())


def test_ablations_zero_the_terms() -> None:
    inp, t = _inputs(("a", "v"), ("sensor:v",))
    ce = F.cross_entropy(t["logits"]["v"], t["y"]).item()
    assert _stage(lambda_a=0.0, lambda_c=0.0).loss(inp).item() == pytest.approx(ce)
    assert _stage(lambda_a=0.0).loss(inp).item() > ce     # R_c only
    assert _stage(lambda_c=0.0).loss(inp).item() > ce     # R_a only


def test_mcft_needs_the_chain_schedule() -> None:
    with pytest.raises(ScenarioError, match="modality_chain"):
        MCFTStage(MCFTParams()).bind(SimpleNamespace(schedule=SimpleNamespace(
            name="joint", params=lambda: {})), ("a", "v"))
