"""Loss building blocks (raymm.protocol.losses): padding rows (weight 0) are kept out of every
mean, cross-entropy by rows is torch's, its hand-written gradient is autograd's, and the
proximal term is the squared distance to the received parameters."""

from __future__ import annotations

from types import SimpleNamespace

import torch
import torch.nn.functional as F

from raymm.protocol.losses import (
    contrastive_ce,
    cross_entropy_rows,
    cross_entropy_with_grad,
    mean_cross_entropy,
    prox_term,
    sample_mean,
)


def _batch(n: int, c: int = 4, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, c, generator=g) * 3, torch.randint(0, c, (n,), generator=g)


def test_padding_rows_are_left_out_of_every_mean() -> None:
    values = torch.tensor([[1.0, 2.0], [3.0, 4.0], [100.0, -100.0]])
    assert torch.equal(sample_mean(values, None), values.mean(0))
    torch.testing.assert_close(sample_mean(values, torch.tensor([1.0, 1.0, 0.0])),
                               torch.tensor([2.0, 3.0]))
    logits, y = _batch(5)
    padded = torch.cat([logits, torch.full((2, 4), 50.0)])
    weight = torch.tensor([1.0] * 5 + [0.0] * 2)
    torch.testing.assert_close(mean_cross_entropy(padded, torch.cat([y, y[:2]]), weight),
                               F.cross_entropy(logits, y))
    sim = torch.randn(5, 5, generator=torch.Generator().manual_seed(1))
    sim_padded = torch.zeros(7, 7)
    sim_padded[:5, :5] = sim
    sim_padded[5:, :] = 9.0
    sim_padded[:, 5:] = 9.0                                      # would win every row
    torch.testing.assert_close(contrastive_ce(sim_padded, weight), contrastive_ce(sim, None))


def test_cross_entropy_rows_and_the_hand_written_gradient_are_torchs() -> None:
    logits, y = _batch(9)
    torch.testing.assert_close(cross_entropy_rows(logits, y),
                               F.cross_entropy(logits, y, reduction="none"))
    leaf = logits.clone().requires_grad_(True)
    F.cross_entropy(leaf, y, reduction="sum").backward()
    rows, grad = cross_entropy_with_grad(logits, y)
    torch.testing.assert_close(rows, F.cross_entropy(logits, y, reduction="none"))
    torch.testing.assert_close(grad, leaf.grad)


def test_the_proximal_term_is_the_squared_distance_to_the_received_parameters() -> None:
    inp = SimpleNamespace(trainable={"w": torch.tensor([1.0, 2.0]), "b": torch.tensor([3.0])},
                          anchor={"w": torch.tensor([0.0, 0.0]), "b": torch.tensor([1.0])})
    assert prox_term(inp).item() == 1.0 + 4.0 + 4.0
