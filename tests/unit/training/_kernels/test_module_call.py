"""One shared module called with parameter tensors given per call
(raymm.training._kernels.module_call): torch.func.functional_call's numbers, gradients to the
given tensors, the module's own parameters back afterwards (also after an exception), and
tied parameters refused."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.func import functional_call

from raymm.training._kernels.module_call import ModuleCall


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 5), nn.ReLU(), nn.Linear(5, 2))


def test_a_call_with_given_tensors_is_functional_call() -> None:
    net = _net()
    own = {n: p.detach().clone() for n, p in net.named_parameters()}
    given = {n: (p.detach() * 2 + 1).requires_grad_(True) for n, p in net.named_parameters()}
    x = torch.randn(3, 4)
    out = ModuleCall(net)(given, x)
    torch.testing.assert_close(out, functional_call(net, given, (x,)), rtol=0, atol=0)
    out.sum().backward()
    assert all(t.grad is not None for t in given.values())
    assert all(p.grad is None for p in net.parameters())
    for n, p in net.named_parameters():                      # its own are back in place
        assert torch.equal(p, own[n]) and isinstance(p, nn.Parameter)


def test_a_part_of_the_module_and_an_exception_leave_the_module_as_it_was() -> None:
    net = _net()
    call = ModuleCall(net)
    w = torch.zeros(2, 5)
    out = call.run({"2.weight": w}, net[2], torch.ones(1, 5))
    torch.testing.assert_close(out, net[2].bias.detach()[None])
    with pytest.raises(RuntimeError):
        call.run({"0.weight": torch.zeros(5, 4)}, net, torch.ones(1, 7))   # wrong width
    assert isinstance(net[0].weight, nn.Parameter) and net[0].weight.abs().sum() > 0


def test_tied_parameters_are_refused() -> None:
    tied = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 3))
    tied[1].weight = tied[0].weight
    with pytest.raises(ValueError, match="without tied parameters"):
        ModuleCall(tied)
