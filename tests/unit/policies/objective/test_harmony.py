"""Harmony's local loss (policies.objective.harmony) by hand: each unimodal network, then the
fused prediction; a multimodal device trains each branch as if alone."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from policies.objective.harmony import HarmonyObjective
from raymm.models.network import ModelOutput
from raymm.protocol.seams import LossInputs


def test_loss_trains_each_unimodal_network_then_the_fused_prediction() -> None:
    obj = HarmonyObjective(None)
    obj.fusion_start = 7
    y = torch.tensor([0, 1])
    la, lb = torch.tensor([[2.0, 0.0], [0.0, 1.0]]), torch.tensor([[0.0, 3.0], [1.0, 1.0]])
    fused = torch.tensor([[5.0, 0.0], [0.0, 5.0]])
    out = ModelOutput(fused, None, {}, {"a": la, "b": lb})

    def inp(t: int, held: tuple[str, ...]) -> LossInputs:
        return LossInputs(out, y, torch.ones(2, 2), held, {}, {}, {}, t)

    ce_a, ce_b = F.cross_entropy(la, y), F.cross_entropy(lb, y)
    torch.testing.assert_close(obj.loss(inp(6, ("a", "b"))), ce_a + ce_b)
    torch.testing.assert_close(obj.loss(inp(6, ("b",))), ce_b)
    torch.testing.assert_close(obj.loss(inp(7, ("a", "b"))), F.cross_entropy(fused, y))


def test_a_multimodal_device_trains_each_branch_as_alone() -> None:
    """Summed unimodal losses: each encoder's gradient is that of its own unimodal loss."""
    torch.manual_seed(0)
    ea, eb = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    x, y = torch.randn(4, 3), torch.tensor([0, 1, 1, 0])
    out = ModelOutput(torch.zeros(4, 2), None, {}, {"a": ea(x), "b": eb(x)})
    obj = HarmonyObjective(None)
    obj.fusion_start = 2
    obj.loss(LossInputs(out, y, torch.ones(4, 2), ("a", "b"), {}, {}, {}, 1)).backward()
    alone = torch.nn.Linear(3, 2)
    alone.load_state_dict(ea.state_dict())
    F.cross_entropy(alone(x), y).backward()
    torch.testing.assert_close(ea.weight.grad, alone.weight.grad)
