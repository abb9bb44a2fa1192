"""How big a model is before it is built (raymm.models.size): parameters counted on torch's
meta device, a model past 4 GiB per copy refused with the fields to lower, and the FLOPs of one
training sample."""

from __future__ import annotations

import torch

from raymm.config.schema import ModelSpec
from raymm.data import load_dataset
from raymm.models.build import build_model
from raymm.models.size import MAX_MODEL_PARAMS, flops_per_sample, model_problem


def test_a_model_is_sized_on_the_meta_device_and_refused_past_the_limit() -> None:
    shapes = {"a": (8,), "b": (6,)}
    assert model_problem(("a", "b"), shapes, 4, ModelSpec(embed_dim=8, hidden=16)) is None
    huge = ModelSpec(embed_dim=65_536, hidden=65_536, fusion_dim=65_536)
    problem = model_problem(("a", "b"), shapes, 4, huge)
    assert problem is not None and problem.startswith("model: ")
    assert f"is more than this simulator allows ({MAX_MODEL_PARAMS:,})" in problem
    assert "lower model.embed_dim, model.hidden or model.fusion_dim" in problem


def test_flops_of_a_linear_model_are_what_its_products_cost() -> None:
    ds = load_dataset("synthetic", {"n_train": 20, "n_test": 5}, 0)
    model = build_model(ds, ModelSpec(encoder="identity", hidden=16, fusion_dim=16), 0)
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert linears
    # forward 2·in·out per layer; backward the same for the weights and (but for the first
    # layer, whose input needs no gradient) for the inputs
    flops = flops_per_sample(model, ds)
    products = sum(m.in_features * m.out_features for m in linears)
    assert 4 * products <= flops <= 6 * products
    before = [p.detach().clone() for p in model.parameters()]
    assert flops_per_sample(model, ds) == flops                # deterministic
    assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
