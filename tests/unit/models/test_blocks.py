"""The fusion layer split into per-sensor column blocks (`model.fusion_blocks: sensor`) is the
concatenated layer: same initial weights, same outputs, same gradients, and a whole run with
every group uploaded gives the plain model's numbers; only where the blocks travel changes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from raymm.config.schema import ModelSpec
from raymm.models.blocks import BlockFusion, block_sensor
from raymm.models.layout import GroupLayout
from raymm.models.network import MultimodalNet
from raymm.training.lockstep.closed_form import linear_chain

from helpers import tiny_run_params

SHAPES = {"acc": (5,), "gyro": (3,)}


def nets(**spec: object) -> tuple[MultimodalNet, MultimodalNet]:
    """The plain and the split model, each built from seed 0."""
    out = []
    for blocks in ("none", "sensor"):
        torch.manual_seed(0)
        out.append(MultimodalNet(("acc", "gyro"), SHAPES, 4,
                                 ModelSpec(encoder="mlp", embed_dim=6, hidden=8, fusion_dim=7,
                                           fusion_blocks=blocks, **spec)))
    return out[0], out[1]


def test_the_blocks_start_as_the_plain_layers_columns_and_give_its_outputs():
    plain, split = nets()
    w = plain.fusion[0].weight
    assert torch.equal(split.fusion.blocks["acc"], w[:, :6])
    assert torch.equal(split.fusion.blocks["gyro"], w[:, 6:])
    assert torch.equal(split.fusion.bias, plain.fusion[0].bias)
    assert torch.equal(split.head.weight, plain.head.weight)   # the same draws after them
    x = {"acc": torch.randn(9, 5), "gyro": torch.randn(9, 3)}
    present = torch.ones(9, 2)
    a, b = plain(x, present), split(x, present)
    assert torch.equal(a.logits, b.logits) and torch.equal(a.z, b.z)
    # the gradient of each block is its columns of the plain layer's gradient
    y = torch.tensor([0, 1, 2, 3, 0, 1, 2, 3, 0])
    torch.nn.functional.cross_entropy(a.logits, y).backward()
    torch.nn.functional.cross_entropy(b.logits, y).backward()
    assert torch.equal(split.fusion.blocks["acc"].grad, plain.fusion[0].weight.grad[:, :6])
    assert torch.equal(split.fusion.blocks["gyro"].grad, plain.fusion[0].weight.grad[:, 6:])


def test_given_blocks_give_the_concatenated_layers_output():
    fusion = BlockFusion({"acc": 2, "gyro": 1}, 2)
    with torch.no_grad():
        fusion.blocks["acc"].copy_(torch.tensor([[1.0, -1.0], [0.5, 2.0]]))
        fusion.blocks["gyro"].copy_(torch.tensor([[3.0], [-4.0]]))
        fusion.bias.copy_(torch.tensor([0.5, 1.0]))
    e = torch.tensor([[2.0, 1.0, 1.0]])   # e_acc = [2, 1], e_gyro = [1]
    # W e + b = [2 - 1 + 3 + 0.5, 1 + 2 - 4 + 1] = [4.5, 0] -> ReLU
    assert fusion(e).tolist() == [[4.5, 0.0]]


def test_each_block_travels_with_its_sensor_and_the_bias_in_shared():
    plain, split = nets(aux_heads=True)
    assert split.group_of("fusion.blocks.acc") == "sensor:acc"
    assert split.group_of("fusion.blocks.gyro") == "sensor:gyro"
    assert split.group_of("fusion.bias") == "shared"
    assert block_sensor("fusion.0.weight") is None and block_sensor("encoders.acc.0") is None
    a, b = GroupLayout(plain).sizes, GroupLayout(split).sizes
    assert b["sensor:acc"] == a["sensor:acc"] + 7 * 6
    assert b["sensor:gyro"] == a["sensor:gyro"] + 7 * 6
    assert b["shared"] == a["shared"] - 7 * 12
    assert sum(a.values()) == sum(b.values())


def test_without_a_fusion_layer_the_option_changes_nothing():
    torch.manual_seed(0)
    late = MultimodalNet(("acc", "gyro"), SHAPES, 4,
                         ModelSpec(encoder="mlp", fusion="sum_logits", fusion_blocks="sensor"))
    assert late.fusion is None
    assert {late.group_of(n) for n, _ in late.named_parameters()} == {"sensor:acc",
                                                                     "sensor:gyro"}


def test_the_closed_form_chain_declines_the_split_layer():
    """One sensor, MLP encoder, concat fusion: the plain model is a Linear/ReLU chain the
    hand-written lock-step gradient knows; the split one is not, and autograd takes it."""
    models = []
    for blocks in ("none", "sensor"):
        models.append(MultimodalNet(("acc",), {"acc": (5,)}, 3,
                                    ModelSpec(encoder="mlp", fusion_blocks=blocks)))
    assert linear_chain(models[0]) is not None
    assert linear_chain(models[1]) is None


@pytest.fixture()
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)   # run(out=None) writes under ./runs


@pytest.mark.usefixtures("_in_tmp")
def test_uploading_every_group_the_split_model_runs_as_the_plain_one():
    """With every group sent by every device, where a block travels changes no mean: the same
    losses, accuracies and traffic, round by round, and the same final weights."""
    common = {"training.optimizer": "adam", "training.lr": 0.01}
    plain, plain_rows = tiny_run_params(common)
    split, split_rows = tiny_run_params({**common, "model.fusion_blocks": "sensor"})
    keys = ("train_loss", "accuracy", "bytes_up", "bytes_down")
    for r, s in zip(plain_rows, split_rows, strict=True):
        for k in keys:
            if k in r:
                assert r[k] == s[k], k
    joined = np.concatenate([split["sensor:a"][-16 * 8:], split["sensor:b"][-16 * 8:]])
    # the plain `shared` vector starts with the fusion layer's weight [16, 8 + 8]
    w = plain["shared"][:16 * 16].reshape(16, 16)
    assert np.array_equal(np.concatenate([w[:, :8].ravel(), w[:, 8:].ravel()]), joined)


@pytest.mark.usefixtures("_in_tmp")
def test_lockstep_matches_sequential_with_blocks_held():
    extra = {"model.fusion_blocks": "sensor", "training.upload": "held",
             "selection.name": "all_online", "training.optimizer": "adam",
             "training.lr": 0.01, "training.batch_size": 7}
    seq, seq_rows = tiny_run_params({**extra, "execution.training.path": "sequential"})
    vec, vec_rows = tiny_run_params({**extra, "execution.training.path": "lockstep"})
    assert seq.keys() == vec.keys()
    for g in seq:
        np.testing.assert_allclose(vec[g], seq[g], rtol=0, atol=1e-5, err_msg=g)
    np.testing.assert_allclose([r["train_loss"] for r in vec_rows],
                               [r["train_loss"] for r in seq_rows], atol=1e-5)


@pytest.mark.usefixtures("_in_tmp")
def test_a_device_lacking_a_sensor_is_sent_its_blocks_product_not_its_embedding():
    """Pod-wise (upload: held), a one-sensor device receives its own group and `shared`, and
    for the sensor it lacks what the fusion layer needs of that sensor's zero input: without
    the split E = 8 floats (the embedding) beside the whole W [16, 16] in `shared`; with it
    F = 16 floats (W^(m) E_m(0)) beside only its own block [16, 8]. Per device and round:
    (16·8 + 16) - (16·16 + 8) = -120 floats, 480 bytes fewer."""
    one_sensor = {"population.tiers": [{"sensors": ["a"], "count": 6},
                                       {"sensors": ["b"], "count": 6}],
                  "training.upload": "held"}
    _, plain = tiny_run_params(one_sensor)
    _, split = tiny_run_params({**one_sensor, "model.fusion_blocks": "sensor"})
    for r, s in zip(plain, split, strict=True):
        assert r["selected"] == s["selected"] > 0
        assert s["bytes_down"] - r["bytes_down"] == -480 * r["selected"]
