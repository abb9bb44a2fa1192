"""FedProto's device side (policies.objective.fedproto): the prototype-distance loss, late
fusion's prototype spaces and nearest-prototype prediction by hand; the method's rules, and
in runs: only prototypes travel (and are counted), every device keeps its own model."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import policies
from policies.objective.fedproto import (
    FedProtoObjective,
    FedProtoParams,
    class_means,
    nearest_prototype,
    prototype_distance,
)
from raymm.app.api import run
from raymm.app.build import load_scenario
from raymm.app.variants import method_variant
from raymm.config.schema import read_yaml
from raymm.errors import ScenarioError
from raymm.models.network import ModelOutput
from raymm.protocol.seams import LossInputs

from helpers import REPO, tiny_scenario

SCENARIOS = REPO / "scenarios"


def test_prototype_distance_by_hand() -> None:
    rep = torch.tensor([[1.0, 3.0], [0.0, 0.0], [2.0, 2.0]])
    y = torch.tensor([0, 1, 1])
    protos = torch.tensor([[0.0, 1.0], [2.0, 2.0]])
    # sample 0: ((1)² + (2)²)/2 = 2.5; sample 1: (4 + 4)/2 = 4; sample 2: 0 -> mean 6.5/3
    got = prototype_distance(rep, y, protos, torch.tensor([1.0, 1.0]))
    torch.testing.assert_close(got, torch.tensor(6.5 / 3))
    # class 1 without a prototype: its samples add 0, the mean is still over the batch
    got = prototype_distance(rep, y, protos, torch.tensor([1.0, 0.0]))
    torch.testing.assert_close(got, torch.tensor(2.5 / 3))
    # padding rows (weight 0) count nowhere
    got = prototype_distance(rep, y, protos, torch.tensor([1.0, 1.0]),
                             torch.tensor([1.0, 1.0, 0.0]))
    torch.testing.assert_close(got, torch.tensor(6.5 / 2))


def test_loss_is_cross_entropy_plus_lambda_times_the_distance() -> None:
    z = torch.tensor([[1.0, 3.0], [0.0, 0.0]], requires_grad=True)
    logits = torch.tensor([[2.0, 0.0], [0.0, 1.0]])
    y = torch.tensor([0, 1])
    out = ModelOutput(logits, z, {}, {}, z)
    extras = {"proto/z": torch.tensor([[0.0, 1.0], [2.0, 2.0]]),
              "proto_mask/z": torch.tensor([1.0, 1.0])}
    inp = LossInputs(out, y, torch.ones(2, 1), ("a",), {}, {}, extras)
    got = FedProtoObjective(FedProtoParams(lam=0.5)).loss(inp)
    want = F.cross_entropy(logits, y) + 0.5 * (2.5 + 4.0) / 2
    torch.testing.assert_close(got, want)
    # before the server has prototypes (round 1) it is plain cross-entropy
    plain = LossInputs(out, y, torch.ones(2, 1), ("a",), {}, {}, {})
    torch.testing.assert_close(FedProtoObjective().loss(plain), F.cross_entropy(logits, y))


def test_late_fusion_has_one_prototype_space_per_held_sensor() -> None:
    emb = {"a": torch.tensor([[1.0, 0.0]]), "b": torch.tensor([[0.0, 2.0]])}
    out = ModelOutput(torch.zeros(1, 2), None, emb, {})
    extras = {"proto/a": torch.tensor([[0.0, 0.0], [1.0, 0.0]]),
              "proto_mask/a": torch.tensor([1.0, 1.0]),
              "proto/b": torch.tensor([[0.0, 0.0], [0.0, 0.0]]),
              "proto_mask/b": torch.tensor([1.0, 1.0])}
    y = torch.tensor([0])
    base = F.cross_entropy(torch.zeros(1, 2), y)
    only_a = LossInputs(out, y, torch.ones(1, 2), ("a",), {}, {}, extras)
    both = LossInputs(out, y, torch.ones(1, 2), ("a", "b"), {}, {}, extras)
    obj = FedProtoObjective()
    torch.testing.assert_close(obj.loss(only_a), base + 0.5)          # a: (1² + 0²)/2
    torch.testing.assert_close(obj.loss(both), base + 0.5 + 2.0)      # b: (0 + 2²)/2


def test_nearest_prototype_sums_distances_over_spaces_and_skips_missing_classes() -> None:
    spaces = {"a": torch.tensor([[0.0, 0.0], [5.0, 5.0]]),
              "b": torch.tensor([[1.0, 1.0], [1.0, 1.0]])}
    protos = {"a": torch.tensor([[0.0, 0.0], [5.0, 5.0], [0.0, 0.1]]),
              "b": torch.tensor([[9.0, 9.0], [1.0, 1.0], [1.0, 1.0]])}
    masks = {s: torch.tensor([1.0, 1.0, 1.0]) for s in spaces}
    # sample 0: class 0 costs 0 + 128, class 1 costs 50 + 0, class 2 costs 0.01 + 0 -> 2
    assert nearest_prototype(spaces, protos, masks).tolist() == [2, 1]
    masks["a"] = torch.tensor([1.0, 1.0, 0.0])                   # class 2 has no prototype
    assert nearest_prototype(spaces, protos, masks).tolist() == [1, 1]


def test_class_means_and_counts() -> None:
    rep = torch.tensor([[1.0, 2.0], [3.0, 4.0], [10.0, 0.0]])
    means, counts = class_means(rep, torch.tensor([0, 0, 2]), 3)
    np.testing.assert_allclose(means, [[2.0, 3.0], [0.0, 0.0], [10.0, 0.0]])
    assert counts.tolist() == [2, 0, 1] and counts.dtype == np.int32


def test_fedproto_needs_personal_exchange_and_per_device_evaluation() -> None:
    with pytest.raises(ScenarioError) as err:
        load_scenario(tiny_scenario(**{"method": "fedproto", "eval.scope": "both",
                                       "population.local_test_fraction": 0.25}))
    assert "FedProto has no global model" in str(err.value)
    with pytest.raises(ScenarioError) as err:
        load_scenario(tiny_scenario(**{"method": "fedproto",
                                       "training.exchange": "params"}))
    assert "set training.exchange: personal" in str(err.value)
    with pytest.raises(ScenarioError) as err:
        load_scenario(tiny_scenario(**{"training.exchange": "personal"}))   # fedavg
    assert "personal never sends any" in str(err.value)


def test_only_prototypes_travel_and_every_device_keeps_its_own_model(tmp_path) -> None:
    sc = tiny_scenario(**{"method": "fedproto", "rounds": 4, "eval.every": 2})
    res = run(load_scenario(sc), out=tmp_path)
    init = run(load_scenario({**sc, "rounds": 1}), out=tmp_path / "one").params
    for g, v in res.params.items():              # the server has no model to change
        np.testing.assert_array_equal(v, init[g])
    rows = res.rows
    # uplink: prototypes of held classes, F = fusion_dim 16: (16 + 1)·4 bytes per class
    assert all(r["bytes_up"] % (17 * 4) == 0 and r["bytes_up"] > 0 for r in rows)
    assert rows[0]["bytes_down"] == 0                       # no prototypes yet in round 1
    per = rows[1]["bytes_down"] / rows[1]["selected"]     # [C=4, 16] + mask [4], float32
    assert per == (4 * 16 + 4) * 4
    assert res.summary["final_acc_proto"] is not None and res.summary["final_accuracy"] > 0.3


def test_fedproto_runs_on_the_fedmchain_protocol_with_periodic_prototypes(tmp_path) -> None:
    raw = method_variant(read_yaml(SCENARIOS / "fedmchain_synthetic.yaml"), "fedproto",
                         policies.PRESETS)
    assert raw["training"]["sync_every"] == 2 and raw["eval"]["scope"] == "devices"
    raw["rounds"] = 4
    res = run(raw, out=tmp_path)
    ups = [r["bytes_up"] for r in res.rows]
    assert ups[0] == ups[2] == 0 and ups[1] > 0 and ups[3] > 0   # prototypes at syncs only
    assert res.summary["final_acc_proto"] is not None
