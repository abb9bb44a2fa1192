"""Building the network every process starts from (raymm.models.build): the same initial
weights for the same seed, whatever the caller's torch generator did, and other weights for
another seed."""

from __future__ import annotations

import torch

from raymm.config.schema import ModelSpec
from raymm.data import load_dataset
from raymm.models.build import build_model, build_net


def _weights(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def test_the_same_seed_builds_the_same_weights_and_leaves_torch_alone() -> None:
    ds = load_dataset("synthetic", {"n_train": 20, "n_test": 5}, 0)
    spec = ModelSpec(embed_dim=4, hidden=8, fusion_dim=8)
    torch.manual_seed(1)
    a = _weights(build_model(ds, spec, 7))
    after = torch.rand(1)
    torch.manual_seed(2)
    torch.rand(5)
    b = _weights(build_model(ds, spec, 7))
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    torch.manual_seed(1)
    assert torch.equal(torch.rand(1), after)                   # the caller's stream untouched
    c = _weights(build_model(ds, spec, 8))
    assert not all(torch.equal(x, y) for x, y in zip(a, c))
    shapes = {m: ds.sensor_shape(m) for m in ds.sensors}
    d = _weights(build_net(ds.sensors, shapes, ds.num_classes, spec, 7))
    assert all(torch.equal(x, y) for x, y in zip(a, d))        # from the shapes alone
