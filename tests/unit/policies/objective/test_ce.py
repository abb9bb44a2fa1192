"""Cross-entropy of the task head (policies.objective.ce), with FedProx's proximal term: the
term by hand, left to the trainer when it adds it outside the loss, and padding rows kept out."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from policies.objective.ce import CEParams, CrossEntropy
from raymm.models.network import ModelOutput
from raymm.protocol.seams import LossInputs


def _inputs(weight: torch.Tensor | None = None, n: int = 5, **kw: object) -> LossInputs:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(n, 3, generator=g)
    y = torch.randint(0, 3, (n,), generator=g)
    out = ModelOutput(logits, None, {}, {})
    return LossInputs(out, y, torch.ones(n, 1), ("a",),
                      {"w": torch.tensor([1.0, 3.0])}, {"w": torch.tensor([0.0, 1.0])},
                      weight=weight, **kw)


def test_plain_cross_entropy_and_fedprox_by_hand() -> None:
    inp = _inputs()
    ce = F.cross_entropy(inp.out.logits, inp.y)
    assert CrossEntropy(CEParams()).loss(inp).item() == pytest.approx(ce.item())
    prox = CrossEntropy(CEParams(mu=0.2))
    # (µ/2)·||θ - θ_received||² = 0.1 · (1 + 4)
    assert prox.loss(inp).item() == pytest.approx(ce.item() + 0.5)
    assert prox.proximal(["w"]) == (0.1, ("w",))
    assert CrossEntropy(CEParams()).proximal(["w"]) == (0.0, ())
    outside = _inputs(proximal_outside=True)
    assert prox.loss(outside).item() == pytest.approx(ce.item())


def test_padding_rows_do_not_count() -> None:
    padded = _inputs(torch.tensor([1.0] * 5 + [0.0] * 2), n=7)
    obj = CrossEntropy(CEParams())
    torch.testing.assert_close(obj.loss(padded),
                               F.cross_entropy(padded.out.logits[:5], padded.y[:5]))
    # without their zero weight the two extra rows count (the check above can fail)
    assert obj.loss(_inputs(n=7)).item() != pytest.approx(obj.loss(padded).item())
    assert CrossEntropy.vectorisable and CrossEntropy.mixes_sensor_sets
