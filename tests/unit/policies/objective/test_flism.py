"""FLISM's local loss (policies.objective.flism), by hand: the distillation term, the supervised
contrastive loss on a 2-sample case, their sum with cross-entropy, the second view that
`augment` appends, the teacher's parameters from the broadcast, and the entropy a device
reports."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch
from torch import Tensor, nn

from policies.objective.flism import ENTROPY, TEACHER, Flism, FlismParams, kd_loss, supcon_loss
from raymm.models.layout import Slot
from raymm.models.network import ModelOutput
from raymm.protocol.seams import LossInputs


def test_kd_term_by_hand() -> None:
    # student (0, 0) -> p_S = (1/2, 1/2); teacher (ln 3, 0) -> p_T = (3/4, 1/4), T = 1:
    # KL(p_T ‖ p_S) = 0.75 ln 1.5 + 0.25 ln 0.5 = 0.1308
    student, teacher = torch.zeros(1, 2), torch.tensor([[math.log(3.0), 0.0]])
    expected = 0.75 * math.log(1.5) + 0.25 * math.log(0.5)
    assert kd_loss(student, teacher, 1.0).item() == pytest.approx(0.130812, abs=1e-6)
    assert kd_loss(student, teacher, 1.0).item() == pytest.approx(expected, rel=1e-6)
    # T = 2 scales the logits by 1/2 and the KL by T² = 4
    half = 0.5 * math.log(3.0)
    pt = torch.softmax(torch.tensor([half, 0.0]), 0)
    kl2 = float((pt * (pt.log() - math.log(0.5))).sum()) * 4
    assert kd_loss(student, teacher, 2.0).item() == pytest.approx(kl2, rel=1e-5)


def _features() -> Tensor:
    # views 1 of samples 0, 1, then views 2 (unnormalised: the loss normalises):
    # a0 = (1, 0), a1 = (0, 1), b0 = (1, 0), b1 = (0, 1) after normalisation
    return torch.tensor([[2.0, 0.0], [0.0, 3.0], [1.0, 0.0], [0.0, 0.5]])


def test_supcon_two_samples_of_different_classes() -> None:
    # anchor a0: candidates a1, b0, b1 with similarities 0, 1, 0 (τ = 1); positive b0 only:
    # -(1 - ln(e⁰ + e¹ + e⁰)) = ln(2 + e) - 1 = 0.5514, the same for every anchor by symmetry
    labels = torch.tensor([0, 1, 0, 1])
    got = supcon_loss(_features(), labels, 1.0, 1.0).item()
    assert got == pytest.approx(math.log(2 + math.e) - 1, rel=1e-6)
    assert got == pytest.approx(0.551444, abs=1e-6)
    # FLISM's τ = 0.1 with the reference loss's base 0.07: (0.1/0.07)·(ln(2 + e¹⁰) - 10)
    # (float32: ln(1 + 9e-5) keeps three digits)
    flism = supcon_loss(_features(), labels, 0.1, 0.07).item()
    assert flism == pytest.approx((0.1 / 0.07) * math.log(1 + 2 * math.exp(-10)), rel=5e-3)


def test_supcon_two_samples_of_one_class() -> None:
    # every other row is a positive: anchor a0 averages log-probabilities of a1, b0, b1:
    # (0 + 1 + 0)/3 - ln(2 + e), so the loss is ln(2 + e) - 1/3 = 1.2181
    got = supcon_loss(_features(), torch.tensor([0, 0, 0, 0]), 1.0, 1.0).item()
    assert got == pytest.approx(math.log(2 + math.e) - 1 / 3, rel=1e-6)


def _inputs(logits: Tensor, z: Tensor, y: list[int], held: tuple[str, ...],
            teacher_logits: Tensor, local: dict[str, Tensor] | None = None,
            seen: list[dict[str, Tensor]] | None = None) -> LossInputs:
    """LossInputs whose `forward` returns `teacher_logits` (and records the parameters)."""
    rows = logits.shape[0]

    def forward(params: Any, x: dict[str, Tensor], present: Tensor) -> ModelOutput:
        if seen is not None:
            seen.append(dict(params))
        assert present.shape[0] == len(y) and all(v.shape[0] == len(y) for v in x.values())
        return ModelOutput(teacher_logits, None, {}, {})

    out = ModelOutput(logits, z, {}, {})
    w = torch.zeros(1)
    return LossInputs(out, torch.tensor(y), torch.ones(rows, 2), held, {"w": w},
                      {"w": torch.ones(1)}, local=local or {},
                      x={"a": torch.zeros(rows, 3), "b": torch.zeros(rows, 3)},
                      forward=forward)


def test_loss_is_ce_plus_supcon_plus_kd() -> None:
    # one sample of class 0 and its second view; logits (0, 0): CE = ln 2; its only
    # candidate is its own view, so SupCon = 0; the teacher's (ln 3, 0) adds 0.1308
    obj = Flism(FlismParams())
    logits = torch.zeros(2, 2)
    teacher = torch.tensor([[math.log(3.0), 0.0]])
    inp = _inputs(logits, torch.tensor([[1.0, 0.0], [0.0, 1.0]]), [0], ("a", "b"), teacher)
    assert obj.loss(inp).item() == pytest.approx(math.log(2) + 0.130812, abs=1e-6)
    # λ_kd = 2 doubles the distillation term
    two = Flism(FlismParams(kd_weight=2.0)).loss(inp).item()
    assert two == pytest.approx(math.log(2) + 2 * 0.130812, abs=1e-6)


def test_supcon_term_enters_with_two_views_only() -> None:
    # two samples (classes 0, 1), their views: the contrastive loss of the first test
    # (τ = τ_base = 1), CE of logits (0, 0) = ln 2, no distillation
    obj = Flism(FlismParams(kd_weight=0.0, supcon_temperature=1.0,
                            supcon_base_temperature=1.0))
    inp = _inputs(torch.zeros(4, 2), _features(), [0, 1], ("a", "b"), torch.zeros(2, 2))
    assert obj.loss(inp).item() == pytest.approx(math.log(2) + math.log(2 + math.e) - 1,
                                                 rel=1e-6)
    # a one-sensor device has no second view: cross-entropy alone
    one = _inputs(torch.zeros(2, 2), _features()[:2], [0, 1], ("a",), torch.zeros(2, 2))
    assert obj.loss(one).item() == pytest.approx(math.log(2), rel=1e-6)


def test_teacher_is_the_broadcast_else_the_received_model() -> None:
    obj, seen = Flism(FlismParams()), []
    teacher = {TEACHER + "w": torch.full((1,), 5.0)}
    obj.loss(_inputs(torch.zeros(1, 2), torch.ones(1, 2), [0], ("a",), torch.zeros(1, 2),
                     teacher, seen))
    obj.loss(_inputs(torch.zeros(1, 2), torch.ones(1, 2), [0], ("a",), torch.zeros(1, 2),
                     None, seen))
    assert seen[0]["w"].item() == 5.0 and seen[1]["w"].item() == 1.0   # the anchor


def test_teacher_parameters_from_the_broadcast_vectors() -> None:
    layout = type("L", (), {"slots": {"g": [Slot("w", (2,), 0, 2), Slot("b", (1,), 2, 3),
                                            Slot("stat", (1,), 3, 4, buffer=True)]}})()
    got = Flism(FlismParams()).device_tensors(
        {}, {TEACHER + "g": np.array([1.0, 2.0, 3.0, 9.0], np.float32),
             "other": np.zeros(1, np.float32)}, layout, ["g"])  # type: ignore[arg-type]
    assert set(got) == {TEACHER + "w", TEACHER + "b"}
    assert got[TEACHER + "w"].tolist() == [1.0, 2.0] and got[TEACHER + "b"].tolist() == [3.0]


def test_second_view_drops_a_held_sensor_and_adds_noise() -> None:
    obj = Flism(FlismParams(noise_std=0.7))
    xb = {"a": torch.ones(4000, 2), "b": torch.full((4000, 2), 2.0), "c": torch.zeros(4000, 2)}
    present = torch.tensor([[1.0, 1.0, 0.0]]).expand(4000, -1)
    x, p = obj.augment(xb, present, ("a", "b"), ("a", "b", "c"),
                       torch.Generator().manual_seed(0))
    assert all(v.shape[0] == 8000 for v in x.values()) and p.shape == (8000, 3)
    assert torch.equal(x["a"][:4000], xb["a"]) and torch.equal(p[:4000], present)
    assert xb["a"].eq(1.0).all()   # inputs not mutated
    second = p[4000:]
    kept = [m for j, m in enumerate("ab") if second[0, j] == 1.0]
    assert len(kept) == 1 and second[:, 2].eq(0).all()   # a non-empty proper subset dropped
    base = {"a": 1.0, "b": 2.0, "c": 0.0}
    for m in "abc":
        offset = base[m] if m in kept else 0.0   # a dropped sensor is noise alone
        noise = x[m][4000:] - offset
        assert abs(noise.mean().item()) < 0.05 and noise.std().item() == pytest.approx(0.7,
                                                                                       rel=0.05)
    again, _ = obj.augment(xb, present, ("a", "b"), ("a", "b", "c"),
                           torch.Generator().manual_seed(0))
    assert all(torch.equal(again[m], x[m]) for m in x)   # from the device's stream only
    same, same_p = obj.augment(xb, present, ("a",), ("a", "b", "c"), torch.Generator())
    assert same is xb and same_p is present   # one held sensor: no second view


class _Uniform(nn.Module):
    """Logits (0, 0, 0, 0) for every row, whatever the inputs."""

    def forward(self, xs: dict[str, Tensor], present: Tensor,
                use_adapter: bool = False) -> ModelOutput:
        assert not self.training   # evaluated in eval mode
        return ModelOutput(torch.zeros(present.shape[0], 4), None, {}, {})


def test_device_reports_its_mean_predictive_entropy() -> None:
    model = _Uniform()
    got = Flism(FlismParams()).device_extras(model, {"a": torch.zeros(3, 1)},  # type: ignore
                                             torch.zeros(3, dtype=torch.long),
                                             torch.ones(1), False)
    assert got[ENTROPY].dtype == np.float32
    assert got[ENTROPY].tolist() == pytest.approx([math.log(4)], rel=1e-6)   # uniform over 4
    assert model.training   # mode restored
