"""Attention fusion (raymm.models.attention, `model.fusion: attention`): the pooling by hand,
masking (not zero-filling) of absent sensors, no NaN for a sample without sensors, the network
around it (groups, facts, sizes, vmap), and its refusal of unequal embedding sizes."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torch.func import functional_call, vmap

from raymm.config.schema import ModelSpec, Scenario
from raymm.models.attention import AttentionPool
from raymm.models.factory import ModelFacts
from raymm.models.network import SHARED, MultimodalNet


def _unit_pool() -> AttentionPool:
    """One head, E = 1, attention width 1: W1 = 1, b1 = 0, w2 = 1 (b2 = 0: left out)."""
    pool = AttentionPool(embed_dim=1, hidden=1, heads=1)
    with torch.no_grad():
        pool.score.weight.fill_(1.0)
        pool.score.bias.zero_()
        pool.weigh.weight.fill_(1.0)
    return pool


def test_pooling_by_hand_and_an_absent_sensor_is_masked_not_zero_filled() -> None:
    pool = _unit_pool()
    tokens = torch.tensor([[[0.5], [-0.5]]])        # e1 = 0.5, e2 = -0.5
    # scores tanh(±0.5) = ±0.462117; a1 = 1 / (1 + exp(-0.924234)) = 0.715904
    a1 = 1.0 / (1.0 + math.exp(-2.0 * math.tanh(0.5)))
    assert a1 == pytest.approx(0.715904, abs=1e-6)
    # z = 0.715904·0.5 − 0.284096·0.5 = 0.215904
    both = pool(tokens, torch.tensor([[1.0, 1.0]]))
    assert both.item() == pytest.approx(0.215904, abs=1e-6)
    # sensor 2 absent: a1 = 1, z = e1 exactly (zero-filling would give the zero token the
    # weight 1 / (1 + exp(tanh(0.5))) ≈ 0.3865 and z ≈ 0.3068)
    alone = pool(tokens, torch.tensor([[1.0, 0.0]]))
    assert alone.item() == 0.5
    weights = pool.weights(tokens, torch.tensor([[1.0, 0.0]]))
    assert weights[0, :, 0].tolist() == [1.0, 0.0]


def test_heads_concatenate_and_a_sample_without_sensors_pools_to_zero() -> None:
    torch.manual_seed(0)
    pool = AttentionPool(embed_dim=3, hidden=5, heads=2)
    tokens = torch.randn(4, 2, 3, requires_grad=True)
    present = torch.tensor([[1.0, 1.0], [1.0, 0.0], [0.0, 1.0], [0.0, 0.0]])
    out = pool(tokens, present)
    assert out.shape == (4, 6)
    a = pool.weights(tokens, present)
    # each head: a softmax over the present sensors only
    torch.testing.assert_close(a.sum(dim=1), present.amax(dim=1, keepdim=True).expand(4, 2))
    manual = torch.cat([(a[:, :, h:h + 1] * tokens).sum(dim=1) for h in range(2)], dim=1)
    torch.testing.assert_close(out, manual)
    torch.testing.assert_close(out[1], tokens[1, 0].repeat(2))    # one sensor: its embedding
    assert out[3].abs().max().item() == 0.0                        # none: zero, not NaN
    out.sum().backward()
    assert tokens.grad is not None and torch.isfinite(tokens.grad).all()
    assert tokens.grad[3].abs().max().item() == 0.0
    assert all(torch.isfinite(p.grad).all() for p in pool.parameters() if p.grad is not None)


def _net(**spec: object) -> MultimodalNet:
    model = ModelSpec(fusion="attention", embed_dim=8, hidden=16, fusion_dim=16,
                      attention_heads=3, attention_hidden=10, **spec)  # type: ignore[arg-type]
    return MultimodalNet(("a", "b"), {"a": (8,), "b": (6,)}, 4, model)


def test_the_network_fuses_by_attention_in_the_shared_group() -> None:
    torch.manual_seed(1)
    net = _net(adapter=True)
    fusion = {n: net.group_of(n) for n, _ in net.named_parameters()
              if n.startswith(("fusion", "head"))}
    assert fusion and set(fusion.values()) == {SHARED}
    assert net.fusion is not None and net.fusion.pool.score.weight.shape == (10, 8)
    assert net.fusion.project.weight.shape == (16, 3 * 8)
    facts = ModelFacts.of(net)
    assert facts.fused and not facts.logit_fusion and facts.sensor_groups and facts.adapter
    x = {"a": torch.randn(5, 8), "b": torch.randn(5, 6)}
    present = torch.tensor([[1.0, 1.0], [1.0, 0.0], [0.0, 1.0], [0.0, 0.0], [1.0, 1.0]])
    out = net(x, present, use_adapter=True)
    assert out.logits.shape == (5, 4) and out.z is not None and out.z.shape == (5, 16)
    assert torch.isfinite(out.logits).all()
    # an absent sensor's input does not matter (masked): change it, same output
    x2 = {"a": x["a"].clone(), "b": x["b"] + 100.0}
    again = net(x2, present, use_adapter=True)
    torch.testing.assert_close(again.logits[1], out.logits[1])
    torch.testing.assert_close(again.logits[3], out.logits[3])
    # the embeddings given from outside (lock-step's encoders) give the same output
    given = net(x, present, embeddings={m: net.encoders[m](x[m]) for m in ("a", "b")})
    torch.testing.assert_close(given.logits, net(x, present).logits)


def test_the_network_runs_under_vmap_as_per_device() -> None:
    torch.manual_seed(2)
    net = _net()
    k = 3
    params = {n: p.detach() + 0.01 * torch.randn(k, *p.shape)
              for n, p in net.named_parameters()}
    xa, xb = torch.randn(k, 5, 8), torch.randn(k, 5, 6)
    present = (torch.rand(k, 5, 2) > 0.4).float()

    def logits(p: dict[str, torch.Tensor], a: torch.Tensor, b: torch.Tensor,
               pr: torch.Tensor) -> torch.Tensor:
        return functional_call(net, p, ({"a": a, "b": b}, pr)).logits

    batched = vmap(logits)(params, xa, xb, present)
    for d in range(k):
        one = logits({n: p[d] for n, p in params.items()}, xa[d], xb[d], present[d])
        torch.testing.assert_close(batched[d], one)


def test_unequal_embedding_sizes_are_refused() -> None:
    spec = ModelSpec(fusion="attention", encoders={"a": "identity", "b": "identity"})
    with pytest.raises(ValueError, match="one size"):
        MultimodalNet(("a", "b"), {"a": (8,), "b": (6,)}, 4, spec)


def test_the_closed_form_declines_attention_fusion() -> None:
    from raymm.training.lockstep.closed_form import linear_chain

    spec = ModelSpec(fusion="attention", encoder="mlp", embed_dim=4, hidden=8, fusion_dim=8)
    one = MultimodalNet(("a",), {"a": (8,)}, 3, spec)
    assert linear_chain(one) is None
    concat = MultimodalNet(("a",), {"a": (8,)}, 3, spec.model_copy(update={"fusion": "concat"}))
    assert linear_chain(concat) is not None
    assert isinstance(one.fusion, nn.Module)


def test_attention_keys_stay_out_of_other_scenarios_files() -> None:
    plain = Scenario.model_validate({"name": "s", "rounds": 1}).to_dict()
    assert "attention_heads" not in plain["model"]
    att = Scenario.model_validate({"name": "s", "rounds": 1,
                                   "model": {"fusion": "attention"}}).to_dict()
    assert att["model"]["attention_heads"] == 6 and att["model"]["attention_hidden"] == 512
