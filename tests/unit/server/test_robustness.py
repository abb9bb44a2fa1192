"""Robustness of a global model (raymm.server.robustness): tier F1 over the less-equipped
tiers, the accuracy lost when one sensor is zeroed, and each sensor head alone, from one
evaluator."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from raymm.config.schema import ModelSpec
from raymm.data.base import Split
from raymm.models import MultimodalNet
from raymm.server.evaluation import SubsetEvaluator
from raymm.server.metrics import pooled_f1
from raymm.server.robustness import head_accuracies, robustness_metrics


def _evaluator(aux_heads: bool) -> SubsetEvaluator:
    torch.manual_seed(0)
    model = MultimodalNet(("a", "b"), {"a": (5,), "b": (3,)}, 3,
                          ModelSpec(embed_dim=4, hidden=6, fusion_dim=6, aux_heads=aux_heads))
    rng = np.random.default_rng(0)
    split = Split({"a": rng.normal(size=(40, 5)).astype(np.float32),
                   "b": rng.normal(size=(40, 3)).astype(np.float32)}, rng.integers(0, 3, 40))
    return SubsetEvaluator(model, split, 16)


def test_the_metrics_are_those_of_the_evaluators_subsets() -> None:
    ev = _evaluator(aux_heads=True)
    full = ev(("a", "b")).accuracy
    out = robustness_metrics(ev, ("a", "b"), [("a", "b"), ("a",), ("b",)], 3, full)
    only_a, only_b = ev(("a",)), ev(("b",))
    assert out["acc_drop/a"] == pytest.approx(full - only_b.accuracy)   # a zeroed: b alone
    assert out["acc_drop/b"] == pytest.approx(full - only_a.accuracy)
    assert out["worst_drop"] == pytest.approx(max(out["acc_drop/a"], out["acc_drop/b"]))
    assert out["worst_drop_sensor"] in ("a", "b")
    y = np.asarray(ev.split.y)
    assert out["tier_f1"] == pytest.approx(
        pooled_f1(y, [only_a.predictions, only_b.predictions], 3))
    assert {f"acc_head/{m}" for m in "ab"} <= out.keys()
    assert all(0.0 <= out[f"acc_head/{m}"] <= 1.0 for m in "ab")


def test_a_model_without_sensor_heads_reports_none() -> None:
    assert head_accuracies(_evaluator(aux_heads=False)) == {}
