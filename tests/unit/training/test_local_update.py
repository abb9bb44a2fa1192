"""The one local optimizer (`raymm.training.local_update.FunctionalOptimizer`) is torch.optim's
SGD and Adam bit for bit, run on one device's tensors, and the same update per device on the
lock-step path's stacks."""

import pytest
import torch

from raymm.config.schema import TrainingSpec
from raymm.training.local_update import FunctionalOptimizer, OptimizerState


def _spec(optimizer: str, momentum: float = 0.0, weight_decay: float = 0.0,
          lr: float = 0.1) -> TrainingSpec:
    return TrainingSpec(optimizer=optimizer, lr=lr, momentum=momentum,
                        weight_decay=weight_decay)


def _net() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.ReLU(), torch.nn.Linear(7, 3))


def _loss(net: torch.nn.Module, params: dict[str, torch.Tensor] | None, x: torch.Tensor,
          y: torch.Tensor) -> torch.Tensor:
    out = net(x) if params is None else torch.func.functional_call(net, params, (x,))
    return torch.nn.functional.cross_entropy(out, y)


@pytest.mark.parametrize("spend", [False, True])
@pytest.mark.parametrize("momentum,weight_decay", [(0.0, 0.0), (0.9, 0.0), (0.5, 0.01),
                                                   (0.0, 0.01)])
def test_sgd_equals_torch_sgd(momentum: float, weight_decay: float, spend: bool) -> None:
    """Also when the step may write into the gradients' memory (`spend`)."""
    torch.manual_seed(0)
    ref = _net()
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=momentum,
                              weight_decay=weight_decay)
    params = {n: p.detach().clone() for n, p in ref.named_parameters()}
    opt, state = FunctionalOptimizer(_spec("sgd", momentum, weight_decay)), OptimizerState()
    x, y = torch.randn(6, 8, 5), torch.randint(0, 3, (6, 8))
    for step in range(6):
        opt_ref.zero_grad()
        _loss(ref, None, x[step], y[step]).backward()
        opt_ref.step()
        for p in params.values():
            p.requires_grad_(True)
        grads = torch.autograd.grad(_loss(ref, params, x[step], y[step]),
                                    list(params.values()))
        params, state = opt.step(params, dict(zip(params, grads)), state, spend=spend)
    for n, p in ref.named_parameters():
        assert torch.equal(p.detach(), params[n]), n


def test_a_spent_gradient_is_written_only_where_no_one_else_reads_it() -> None:
    """Autograd hands one tensor to both inputs of an addition: writing `a`'s update into
    it would change the gradient `b` steps with. Views and broadcast gradients are not
    written either."""
    a, b, c = torch.randn(4, 3), torch.randn(4, 3), torch.randn(4, 3)
    leaves = [t.clone().requires_grad_(True) for t in (a, b, c)]
    loss = ((leaves[0] + leaves[1]) ** 2).sum() + leaves[2].sum()
    grads = dict(zip("abc", torch.autograd.grad(loss, leaves)))
    assert grads["a"] is grads["b"] and grads["c"].stride() == (0, 0)  # what is checked
    want = {n: p.add(grads[n], alpha=-0.1) for n, p in zip("abc", (a, b, c))}
    got, _ = FunctionalOptimizer(_spec("sgd")).step(dict(zip("abc", (a, b, c))), grads,
                                                    OptimizerState(), spend=True)
    for n in "abc":
        assert torch.equal(got[n], want[n]), n
    fresh = {"w": torch.randn(2, 5)}
    grad = torch.ones(2, 5)
    got, _ = FunctionalOptimizer(_spec("sgd")).step(fresh, {"w": grad}, OptimizerState(),
                                                    spend=True)
    assert got["w"].data_ptr() == grad.data_ptr()  # a gradient of its own is reused


def test_unused_parameters_are_left_alone() -> None:
    opt = FunctionalOptimizer(_spec("sgd", momentum=0.9, lr=0.5))
    used, unused = torch.ones(3), torch.ones(2)
    params, state = opt.step({"used": used, "unused": unused},
                             {"used": 2 * torch.ones(3), "unused": None}, OptimizerState())
    assert torch.equal(params["used"], torch.zeros(3))
    assert params["unused"] is unused and "unused" not in state.buf
    assert torch.equal(used, torch.ones(3))  # nothing is updated in place


@pytest.mark.parametrize("weight_decay", [0.0, 0.01])
def test_adam_equals_torch_adam(weight_decay: float) -> None:
    """Against torch's single-tensor CPU implementation, with a parameter that gets a gradient
    only in some steps: it keeps its own step count, as in torch."""
    torch.manual_seed(0)
    ref = _net()
    extra_ref = torch.ones(4, requires_grad=True)
    opt_ref = torch.optim.Adam([*ref.parameters(), extra_ref], lr=0.01,
                               weight_decay=weight_decay, foreach=False)
    params = {n: p.detach().clone() for n, p in ref.named_parameters()}
    params["extra"] = torch.ones(4)
    opt, state = FunctionalOptimizer(_spec("adam", 0.0, weight_decay, 0.01)), OptimizerState()
    x, y = torch.randn(8, 8, 5), torch.randint(0, 3, (8, 8))
    for step in range(8):
        use_extra = step % 3 == 1   # the extra parameter takes part in 3 of the 8 steps
        opt_ref.zero_grad(set_to_none=True)
        loss_ref = _loss(ref, None, x[step], y[step])
        loss_ref = loss_ref + (extra_ref ** 2).sum() if use_extra else loss_ref
        loss_ref.backward()
        opt_ref.step()
        for p in params.values():
            p.requires_grad_(True)
        net_params = {n: p for n, p in params.items() if n != "extra"}
        loss = _loss(ref, net_params, x[step], y[step])
        loss = loss + (params["extra"] ** 2).sum() if use_extra else loss
        grads = torch.autograd.grad(loss, list(params.values()), allow_unused=True)
        params, state = opt.step(params, dict(zip(params, grads)), state)
    for n, p in [*ref.named_parameters(), ("extra", extra_ref)]:
        assert torch.equal(p.detach(), params[n]), n
    assert state.steps["extra"] == 3 and state.steps["0.weight"] == 8
    assert not torch.equal(params["extra"], torch.ones(4))


@pytest.mark.parametrize("kind", ["sgd", "adam"])
def test_lockstep_devices_step_as_each_alone(kind: str) -> None:
    """The lock-step path steps stacks [G, ...]: each device's slice moves as if it stepped
    alone (elementwise arithmetic: what vmap over devices computes)."""
    torch.manual_seed(1)
    opt = FunctionalOptimizer(_spec(kind, 0.9 if kind == "sgd" else 0.0, 0.01, 0.05))
    stacked = {"w": torch.randn(3, 4, 5), "b": torch.randn(3, 5)}
    alone = [{n: p[i] for n, p in stacked.items()} for i in range(3)]
    s_state, a_states = OptimizerState(), [OptimizerState() for _ in range(3)]
    for _ in range(4):
        grads = {n: torch.randn_like(p) for n, p in stacked.items()}
        stacked, s_state = opt.step(stacked, grads, s_state)
        for i in range(3):
            alone[i], a_states[i] = opt.step(alone[i], {n: g[i] for n, g in grads.items()},
                                             a_states[i])
    for i in range(3):
        for n in stacked:
            assert torch.equal(stacked[n][i], alone[i][n]), (n, i)


@pytest.mark.parametrize("opt", ["sgd", "adam"])
def test_functional_optimizer_is_torch_optim(opt):
    from raymm.config.schema import TrainingSpec

    t = TrainingSpec(optimizer=opt, lr=0.05, momentum=0.9 if opt == "sgd" else 0.0,
                     weight_decay=0.01)
    w0 = torch.tensor([[1.0, -2.0], [0.5, 3.0]])
    ref = torch.nn.Parameter(w0.clone())
    torch_opt = (torch.optim.Adam([ref], lr=t.lr, weight_decay=t.weight_decay) if opt == "adam"
                 else torch.optim.SGD([ref], lr=t.lr, momentum=t.momentum,
                                      weight_decay=t.weight_decay))
    f = FunctionalOptimizer(t)
    params = {"w": w0.clone().unsqueeze(0).expand(3, 2, 2)}  # three devices, same start
    state = OptimizerState()
    for _ in range(4):
        torch_opt.zero_grad()
        (ref ** 3).sum().backward()
        torch_opt.step()
        params, state = f.step(params, {"w": 3 * params["w"] ** 2}, state)
    for i in range(3):
        torch.testing.assert_close(params["w"][i], ref.detach(), rtol=1e-6, atol=1e-6)
