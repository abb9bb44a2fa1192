"""The sequential path's in-place SGD and Adam are torch.optim.SGD and Adam, bit for bit."""

import pytest
import torch

from raymm.local import InPlaceAdam, InPlaceSGD


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
    assert torch.equal(used.detach(), torch.zeros(3))
    assert torch.equal(unused.detach(), torch.ones(2))


@pytest.mark.parametrize("weight_decay", [0.0, 0.01])
def test_in_place_adam_equals_torch_adam(weight_decay: float) -> None:
    """Against torch's default CPU implementation (the per-parameter loop the sequential path
    used before), and with a parameter that gets a gradient only in some steps: it keeps its
    own step count, as in torch."""
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.ReLU(), torch.nn.Linear(7, 3))
    mine = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.ReLU(), torch.nn.Linear(7, 3))
    mine.load_state_dict(ref.state_dict())
    extra_ref, extra = torch.ones(4, requires_grad=True), torch.ones(4, requires_grad=True)
    opt_ref = torch.optim.Adam([*ref.parameters(), extra_ref], lr=0.01,
                               weight_decay=weight_decay, foreach=False)
    params = [*mine.parameters(), extra]
    opt = InPlaceAdam(params, 0.01, weight_decay)
    x, y = torch.randn(8, 8, 5), torch.randint(0, 3, (8, 8))
    for step in range(8):
        use_extra = step % 3 == 1   # the extra parameter takes part in 3 of the 8 steps
        opt_ref.zero_grad(set_to_none=True)
        loss_ref = torch.nn.functional.cross_entropy(ref(x[step]), y[step])
        loss_ref = loss_ref + (extra_ref ** 2).sum() if use_extra else loss_ref
        loss_ref.backward()
        opt_ref.step()
        loss = torch.nn.functional.cross_entropy(mine(x[step]), y[step])
        loss = loss + (extra ** 2).sum() if use_extra else loss
        opt.step(torch.autograd.grad(loss, params, allow_unused=True))
    for a, b in zip([*ref.parameters(), extra_ref], params):
        assert torch.equal(a, b)
    assert opt.steps[-1] == 3 and opt.steps[0] == 8
    assert not torch.equal(extra.detach(), torch.ones(4))
