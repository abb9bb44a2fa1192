"""Adam for a lock-step program (raymm.training._kernels.lockstep_adam): a device gets the same
bits wherever it sits, the algorithm is torch.optim.Adam's up to rounding, a parameter without
gradient is left as it was, and the proximal term is the loss's own up to rounding."""

import pytest
import torch

from raymm.training._kernels.lockstep_adam import LockstepAdam
from raymm.training.local_update import FunctionalOptimizer


def _lockstep_adam(params: dict[str, torch.Tensor], weight_decay: float = 0.0,
                  grad_sum: bool = False) -> LockstepAdam:
    return LockstepAdam(params, 0.01, FunctionalOptimizer.BETAS, FunctionalOptimizer.EPS,
                       weight_decay, grad_sum)


def test_lockstep_adam_gives_a_device_the_same_bits_wherever_it_sits() -> None:
    """Devices set aside (steps for a prefix only) and per-device step counts: each device's
    parameters are those of the device stepping alone, bit for bit, whatever its row and the
    number of devices beside it (the fused kernel's scalar tail never reaches a device)."""
    torch.manual_seed(2)
    g = 7
    # 31 floats a device: alone, 15 of them would be a tail of the kernel's scalar code
    start = {"w": torch.randn(g, 4, 3), "b": torch.randn(g, 4), "odd": torch.randn(g, 15)}
    prefix = [7, 7, 5, 2, 7, 4, 1, 7] * 4   # devices with a minibatch in each step
    grads = [{n: torch.randn((k,) + p.shape[1:]) for n, p in start.items()} for k in prefix]
    together = _lockstep_adam(start, grad_sum=True)
    for k, gs in zip(prefix, grads):
        together.step(dict(gs), k)
    sums = together.grad_sums()
    assert sums is not None
    for i in range(g):
        alone = _lockstep_adam({n: p[i:i + 1] for n, p in start.items()}, grad_sum=True)
        for k, gs in zip(prefix, grads):
            if i < k:
                alone.step({n: t[i:i + 1] for n, t in gs.items()}, 1)
        alone_sums = alone.grad_sums()
        assert alone_sums is not None
        for n in start:
            assert torch.equal(together.params()[n][i], alone.params()[n][0]), (n, i)
            assert torch.equal(sums[n][i], alone_sums[n][0]), (n, i)


def test_lockstep_adam_is_torch_adam_up_to_rounding() -> None:
    """The same algorithm as torch.optim.Adam (the fused kernel rounds the update otherwise)."""
    torch.manual_seed(3)
    p0 = torch.randn(3, 40)
    adam = _lockstep_adam({"w": p0})
    ref = p0.clone().requires_grad_(True)
    opt = torch.optim.Adam([ref], lr=0.01, foreach=False)
    for _ in range(20):
        grad = torch.randn(3, 40)
        adam.step({"w": grad}, 3)
        ref.grad = grad.clone()
        opt.step()
    assert torch.allclose(adam.params()["w"], ref.detach(), rtol=1e-6, atol=1e-7)
    assert not torch.equal(adam.params()["w"], p0)


@pytest.mark.parametrize("weight_decay", [0.0, 0.01])
def test_lockstep_adam_leaves_a_parameter_without_gradient_as_it_was(weight_decay: float
                                                                     ) -> None:
    torch.manual_seed(4)
    start = {"used": torch.randn(2, 6), "unused": torch.randn(2, 6)}
    adam = _lockstep_adam(start, weight_decay)
    for _ in range(3):
        adam.step({"used": torch.randn(2, 6), "unused": None}, 2)
    assert torch.equal(adam.params()["unused"], start["unused"])
    assert not torch.equal(adam.params()["used"], start["used"])
    with pytest.raises(ValueError, match="unused"):
        adam.step({"used": torch.randn(2, 6), "unused": torch.randn(2, 6)}, 2)


def test_lockstep_adams_proximal_term_is_the_losss_own_up_to_rounding() -> None:
    """c * ||θ - θ_start||² over some parameters, added by `LockstepAdam` (value per device and
    gradient), steps as torch.optim.Adam on a loss that holds the term; devices set aside
    keep their start distance; a parameter outside the term is not pulled."""
    torch.manual_seed(5)
    c, g = 0.7, 3
    start = {"a": torch.randn(g, 4, 3), "free": torch.randn(g, 5), "b": torch.randn(g, 2)}
    adam = LockstepAdam(start, 0.05, FunctionalOptimizer.BETAS, FunctionalOptimizer.EPS, 0.0,
                       False, (c, ("a", "b")))
    refs = [{n: p[i].clone().requires_grad_(True) for n, p in start.items()} for i in range(g)]
    opts = [torch.optim.Adam(list(r.values()), lr=0.05, foreach=False) for r in refs]
    for k in [3, 3, 2, 3, 1, 3]:
        task = {n: torch.randn((k,) + p.shape[1:]) for n, p in start.items()}
        prox = adam.step(task, k)
        assert prox is not None and prox.shape == (k,)
        for i in range(k):
            r = refs[i]
            value = c * sum(((r[n] - start[n][i]) ** 2).sum() for n in ("a", "b"))
            torch.testing.assert_close(prox[i], value.detach(), rtol=1e-5, atol=1e-7)
            opts[i].zero_grad()
            value.backward()
            for n in r:   # the task's gradient on top of the term's
                assert r[n].grad is not None or n == "free"
                r[n].grad = task[n][i] + (r[n].grad if r[n].grad is not None else 0)
            opts[i].step()
    for i in range(g):
        for n in start:
            torch.testing.assert_close(adam.params()[n][i], refs[i][n].detach(), rtol=1e-5,
                                       atol=1e-6)
    assert _lockstep_adam(start).step({n: torch.zeros_like(p) for n, p in start.items()}, g) \
        is None
