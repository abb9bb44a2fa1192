"""The arithmetic floor of a bench round (raymm.app.bench_floor): the products a lock-step step
makes, as torch counts them, timed on one thread."""

import torch

from raymm.app import bench_floor


def test_the_floor_counts_the_products_a_lockstep_step_makes():
    """`round_flops` against what autograd runs for one minibatch of k devices' MLPs under
    vmap (the first layer's input needs no gradient), counted by torch's FLOP counter."""
    from torch.func import vmap
    from torch.utils.flop_counter import FlopCounterMode

    k, d, h, c, b = 7, 12, 10, 5, 9
    g = torch.Generator().manual_seed(0)
    w1, w2 = (torch.randn(k, h, d, generator=g, requires_grad=True),
              torch.randn(k, c, h, generator=g, requires_grad=True))
    b1, b2 = torch.zeros(k, h, requires_grad=True), torch.zeros(k, c, requires_grad=True)
    x, y = torch.randn(k, b, d, generator=g), torch.randint(0, c, (k, b), generator=g)

    def loss(w1, b1, w2, b2, x, y):  # noqa: ANN001, ANN202
        hidden = torch.relu(torch.nn.functional.linear(x, w1, b1))
        return torch.nn.functional.cross_entropy(torch.nn.functional.linear(hidden, w2, b2), y)

    with FlopCounterMode(display=False) as count:
        total = vmap(loss)(w1, b1, w2, b2, x, y).sum()
        torch.autograd.grad(total, [w1, b1, w2, b2])
    assert count.get_total_flops() == bench_floor.round_flops(k, d, h, c, b, b, 1)
    # the same products in the step written out (`raymm.training.lockstep.closed_form`, the default)
    from raymm.training.lockstep.closed_form import Dense, _chain_step
    layers = [Dense("w1", "b1", True), Dense("w2", "b2", False)]
    params = {"w1": w1.detach(), "b1": b1.detach(), "w2": w2.detach(), "b2": b2.detach()}
    with FlopCounterMode(display=False) as count:
        _chain_step(layers, params, x, y, torch.ones(k, b))
    assert count.get_total_flops() == bench_floor.round_flops(k, d, h, c, b, b, 1)
    # two local steps of the standard workload at K = 500: 598 MFLOP
    assert bench_floor.round_flops(500, 64, 64, 6, 64, 32, 1) == 598_016_000


def test_the_floor_is_timed_on_one_thread_and_leaves_the_setting_alone():
    before = torch.get_num_threads()
    seconds = bench_floor.matmul_floor(20, 64, 64, 6, 64, 32, 1, repeat=2)
    assert 0 < seconds < 1 and torch.get_num_threads() == before
