"""BMSFed's modal-enhancement loss (policies.objective.bmsfed), by hand on one sample: the
paper's prototype logits s^m_c = -||e_m - P^m_c||, the ratio ρ of the summed true-class
softmaxes, and L = CE + α·L^(weak sensor)."""

from __future__ import annotations

import math

import pytest
import torch

from policies.objective.bmsfed import (
    BMSFedObjective,
    BMSFedParams,
    enhancement_loss,
    prototype_logits,
)
from raymm.app.build import load_scenario

from helpers import tiny_scenario

# two classes, E = 1, y = 0: P^a = [0, 2], e_a = 0.5; P^v = [0, 1], e_v = 0.9
PROTOS = torch.tensor([[[0.0], [2.0]], [[0.0], [1.0]]])
OK = torch.ones(2, 2)
Y = torch.tensor([0])
EMB = {"a": torch.tensor([[0.5]]), "v": torch.tensor([[0.9]])}


def test_prototype_logits_are_negative_euclidean_distances() -> None:
    s = prototype_logits(EMB["a"], PROTOS[0], OK[0])
    assert s.tolist() == [[-0.5, -1.5]]
    masked = prototype_logits(EMB["a"], PROTOS[0], torch.tensor([1.0, 0.0]))
    assert masked[0, 1] < -1e8   # a class without a prototype leaves the softmax


def test_audio_dominant_sample_pulls_the_visual_branch() -> None:
    # softmax(s^a)[0] = 1/(1+e^-1) = 0.7311, L^a = 0.3133; softmax(s^v)[0] = 1/(1+e^0.8)
    # = 0.3100, L^v = log(1+e^0.8) = 1.1711; ρ = 0.7311/0.3100 = 2.358 > 1 -> α·L^v
    both = torch.ones(1, 2)
    me = enhancement_loss(EMB, Y, both, PROTOS, OK, alpha=2.0)
    assert me.item() == pytest.approx(2 * 1.1711, abs=1e-4)
    assert me.item() == pytest.approx(2 * math.log(1 + math.exp(0.8)), rel=1e-6)


def test_visual_dominant_pulls_audio_and_one_sensor_pulls_itself() -> None:
    emb = {"a": torch.tensor([[1.9]]), "v": torch.tensor([[0.0]])}   # ρ < 1
    l_a = math.log(1 + math.exp(1.9 - 0.1))                       # s^a = [-1.9, -0.1]
    me = enhancement_loss(emb, Y, torch.ones(1, 2), PROTOS, OK, alpha=1.0)
    assert me.item() == pytest.approx(l_a, rel=1e-6)
    # a device training with the audio sensor only: α·L^a whatever ρ says
    only_a = torch.tensor([[1.0, 0.0]])
    me = enhancement_loss(EMB, Y, only_a, PROTOS, OK, alpha=2.0)
    assert me.item() == pytest.approx(2 * math.log(1 + math.exp(-1.0)), rel=1e-6)


def test_padding_rows_do_not_count() -> None:
    emb = {m: torch.cat([e, torch.tensor([[7.0]])]) for m, e in EMB.items()}
    me = enhancement_loss(emb, torch.tensor([0, 1]), torch.ones(2, 2), PROTOS, OK, alpha=2.0,
                          weight=torch.tensor([1.0, 0.0]))
    assert me.item() == pytest.approx(2 * 1.1711, abs=1e-4)


def test_programs_per_sensor_set_under_logit_fusion_only() -> None:
    """Under sum_logits an absent sensor adds exactly nothing: programs per sensor set (same
    bits, faster); under a fusion layer its zero embedding counts: mixed programs."""
    for fusion, mixes in (("sum_logits", False), ("concat", True)):
        obj = BMSFedObjective(BMSFedParams())
        obj.bind(load_scenario(tiny_scenario(method="bmsfed", **{"model.fusion": fusion})),
                 ("a", "b"))
        assert obj.mixes_sensor_sets is mixes
