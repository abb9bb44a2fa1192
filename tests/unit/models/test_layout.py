"""Flat float32 vectors per parameter group (raymm.models.layout): flatten and load are
inverse, buffers travel with their group or stay local (FedBN), and integer buffers go back to
their initial value on every load."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from raymm.config.schema import ModelSpec
from raymm.models import MultimodalNet
from raymm.models.layout import BUFFERS, GroupLayout
from raymm.models.network import LOCAL


def _net(seed: int, **spec: object) -> MultimodalNet:
    torch.manual_seed(seed)
    return MultimodalNet(("a", "b"), {"a": (4,), "b": (3,)}, 2,
                         ModelSpec(embed_dim=3, hidden=5, fusion_dim=4, **spec))


def test_flatten_then_load_gives_another_model_the_same_parameters() -> None:
    src, dst = _net(0, adapter=True), _net(1, adapter=True)
    layout = GroupLayout(src)
    flat = layout.flatten(src)
    assert set(flat) == {"sensor:a", "sensor:b", "shared", LOCAL}
    assert layout.groups == ["sensor:a", "sensor:b", "shared"]        # the adapter stays
    for g, vec in flat.items():
        assert vec.dtype == np.float32 and vec.size == layout.sizes[g]
        assert layout.nbytes(g) == 4 * vec.size
    layout.load(dst, flat)
    for (name, p), q in zip(src.named_parameters(), dst.parameters()):
        assert torch.equal(p, q), name
    a = dict(src.named_parameters())
    for g, slots in layout.slots.items():   # a slot is its parameter's span of the vector
        for s in slots:
            assert np.array_equal(flat[g][s.start:s.stop], a[s.name].detach().reshape(-1))


def test_buffers_travel_with_their_group_or_stay_local() -> None:
    bn = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    bn.group_of = lambda name: "shared"                        # one group, as a factory says
    average, local = GroupLayout(bn), GroupLayout(bn, "local")
    # Linear 12 + 4, batch norm's scale and shift 4 + 4, its running mean and variance 4 + 4
    assert average.sizes == {"shared": 32}
    assert [s.name for s in average.slots["shared"] if s.buffer] == \
        ["1.running_mean", "1.running_var"]
    assert local.sizes == {"shared": 24, BUFFERS: 8} and local.groups == ["shared"]
    assert local.names(["shared", BUFFERS]) == ["0.weight", "0.bias", "1.weight", "1.bias"]
    with pytest.raises(ValueError, match="model.buffers: 'none'"):
        GroupLayout(bn, "none")


def test_loading_a_group_puts_integer_buffers_back_to_their_initial_value() -> None:
    bn = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    bn.group_of = lambda name: "shared"
    layout = GroupLayout(bn)
    flat = layout.flatten(bn)
    bn.train()
    bn(torch.randn(5, 3))                                      # counts one batch
    assert int(bn[1].num_batches_tracked) == 1
    layout.load(bn, flat)
    assert int(bn[1].num_batches_tracked) == 0
    assert torch.equal(bn[1].running_mean, torch.zeros(4))     # the saved statistics again


def test_private_blocks_form_a_group_that_never_travels() -> None:
    """`model.private` moves the named blocks' parameters into the group `private`: the head
    (under logit fusion, every sensor's head) and the fusion layer, in their order; the
    travelling groups keep the rest, and a layout without it is unchanged."""
    from raymm.models.layout import PRIVATE

    shapes: dict[str, tuple[int, ...]] = {"a": (4,), "b": (3,)}

    def layout(**spec: object) -> GroupLayout:
        torch.manual_seed(0)
        return GroupLayout(MultimodalNet(("a", "b"), shapes, 5, ModelSpec.model_validate(spec)))

    plain, ph, phf = layout(), layout(private=["head"]), layout(private=["head", "fusion"])
    assert PRIVATE not in plain.slots
    assert [s.name for s in ph.slots[PRIVATE]] == ["head.weight", "head.bias"]
    assert [s.name for s in ph.slots["shared"]] == ["fusion.0.weight", "fusion.0.bias"]
    assert [s.name for s in phf.slots[PRIVATE]] == ["fusion.0.weight", "fusion.0.bias",
                                                    "head.weight", "head.bias"]
    assert ph.groups == ["sensor:a", "sensor:b", "shared"]
    assert phf.groups == ["sensor:a", "sensor:b"]        # only the encoders are shared
    assert ph.sizes[PRIVATE] == 5 * 64 + 5 and phf.sizes[PRIVATE] == 64 * 2 * 32 + 64 + 325
    late = layout(fusion="sum_logits", private=["head", "fusion"])   # no fusion layer
    assert late.names([PRIVATE]) == ["heads.a.weight", "heads.a.bias", "heads.b.weight",
                                     "heads.b.bias"]
    assert late.groups == ["sensor:a", "sensor:b"]       # each now the encoder alone
    aux = layout(aux_heads=True, private=["head"])       # auxiliary heads stay with sensors
    assert "heads.a.weight" in aux.names(["sensor:a"]) and \
        aux.names([PRIVATE]) == ["head.weight", "head.bias"]
