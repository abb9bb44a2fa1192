"""The sequential path's in-place SGD is torch.optim.SGD, bit for bit."""

import pytest
import torch

from raymm.local import InPlaceSGD


@pytest.mark.parametrize("momentum,weight_decay", [(0.0, 0.0), (0.9, 0.0), (0.5, 0.01)])
def test_in_place_sgd_equals_torch_sgd(momentum: float, weight_decay: float) -> None:
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.ReLU(), torch.nn.Linear(7, 3))
    mine = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.ReLU(), torch.nn.Linear(7, 3))
    mine.load_state_dict(ref.state_dict())
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=momentum,
                              weight_decay=weight_decay)
    params = list(mine.parameters())
    opt = InPlaceSGD(params, 0.1, momentum, weight_decay)
    x, y = torch.randn(6, 8, 5), torch.randint(0, 3, (6, 8))
    for step in range(6):
        opt_ref.zero_grad()
        torch.nn.functional.cross_entropy(ref(x[step]), y[step]).backward()
        opt_ref.step()
        loss = torch.nn.functional.cross_entropy(mine(x[step]), y[step])
        opt.step(torch.autograd.grad(loss, params))
    for a, b in zip(ref.parameters(), mine.parameters()):
        assert torch.equal(a, b)


def test_unused_parameters_are_left_alone() -> None:
    used, unused = torch.ones(3, requires_grad=True), torch.ones(2, requires_grad=True)
    opt = InPlaceSGD([used, unused], 0.5, momentum=0.9)
    grads = torch.autograd.grad((used * 2).sum(), [used, unused], allow_unused=True)
    opt.step(grads)
    assert torch.equal(used.detach(), torch.zeros(3)) and torch.equal(unused.detach(), torch.ones(2))
