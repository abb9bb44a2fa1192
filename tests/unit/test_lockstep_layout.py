"""Memory layout in lock-step training: parameters follow their gradients' layout, which
changes where the numbers lie and never the numbers."""

from __future__ import annotations

import numpy as np
import torch
from torch.func import vmap

from raymm.device.local_update import in_layout_of, laid_out, memory_order

from helpers import host_round
from needs import needs_batch_invariant_matmul


def _vmapped_linear_grads(weight: torch.Tensor) -> torch.Tensor:
    x = torch.randn(weight.shape[0], 5, weight.shape[2], generator=torch.Generator().manual_seed(0))
    w = weight.detach().requires_grad_(True)
    out = vmap(lambda wi, xi: torch.nn.functional.linear(xi, wi))(w, x)
    (g,) = torch.autograd.grad(out.square().sum(), [w])
    return g


def test_a_vmapped_linear_weight_gradient_is_transposed_per_device():
    # the fact the layout rule exists for: if torch ever changes it, the rule is moot, not wrong
    g = _vmapped_linear_grads(torch.randn(4, 3, 6))
    assert memory_order(g) == (0, 2, 1)


def test_in_layout_of_copies_into_the_gradients_layout_and_keeps_the_values():
    p = torch.randn(4, 3, 6)
    g = _vmapped_linear_grads(p)
    out = in_layout_of({"w": p, "b": torch.zeros(4, 3)}, {"w": g, "b": None})
    assert out["w"].stride() == g.stride()
    assert torch.equal(out["w"], p)
    assert out["b"].stride() == (3, 1)


def test_in_layout_of_keeps_an_expanded_start_that_already_agrees():
    base = laid_out(torch.randn(3, 6), (1, 0))      # stored column-major
    p = base.unsqueeze(0).expand(4, 3, 6)           # one vector for every device, no copy
    g = _vmapped_linear_grads(torch.randn(4, 3, 6))
    params = {"w": p}
    assert in_layout_of(params, {"w": g}) is params  # nothing to copy
    row_major = {"w": torch.randn(3, 6).unsqueeze(0).expand(4, 3, 6)}
    assert in_layout_of(row_major, {"w": g})["w"].stride() == g.stride()


def test_laid_out_round_trips_and_skips_a_tensor_already_in_order():
    t = torch.arange(24.0).reshape(2, 3, 4)
    assert laid_out(t, (0, 1, 2)) is t
    c = laid_out(t, (0, 2, 1))
    assert memory_order(c) == (0, 2, 1) and torch.equal(c, t)
    assert laid_out(c, (0, 2, 1)) is c


@needs_batch_invariant_matmul
def test_the_learned_layout_does_not_change_a_lock_step_round():
    """Round 2 starts from the layout round 1 learned; the same round from a fresh trainer
    (row-major starts, copied at the first step) gives the same bits."""
    _, vec, plan, bcast = host_round({})
    first = vec.train(plan, bcast)
    assert vec.vec.orders, "the lock-step run records the layout of what it trained"
    assert any(o == (0, 2, 1) for o in vec.vec.orders.values())
    again = vec.train(plan, bcast)             # starts laid out as learned
    vec.vec.orders.clear()
    fresh = vec.train(plan, bcast)             # starts row-major
    for g in first.updates:
        np.testing.assert_array_equal(again.updates[g], fresh.updates[g])
        np.testing.assert_array_equal(first.updates[g], fresh.updates[g])


def test_stack_rows_uses_consecutive_rows_of_one_matrix_as_they_are():
    from raymm.device.host import stack_rows

    m = np.arange(20.0, dtype=np.float32).reshape(5, 4)
    rows = list(m)
    got = stack_rows(rows[1:4])
    assert np.shares_memory(got, m) and np.array_equal(got, m[1:4])
    # anything else is copied as np.stack would: out of order, gaps, other arrays, copies
    for other in ([rows[2], rows[1]], [rows[0], rows[2]], [rows[0], m[1].copy()],
                  [r.copy() for r in rows]):
        out = stack_rows(other)
        assert not np.shares_memory(out, m) and np.array_equal(out, np.stack(other))
