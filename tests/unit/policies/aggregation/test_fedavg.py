import numpy as np
import pytest
import torch

from policies.aggregation.fedavg import FedAvg
from raymm.config.schema import ModelSpec
from raymm.models.layout import GroupLayout
from raymm.models.network import MultimodalNet
from raymm.protocol.messages import merge_results
from raymm.protocol.seams import AggregationContext
from raymm.protocol.traffic import device_groups

from helpers import host_result


def test_fedavg_per_group_over_senders_only():
    # devices 4 (n=10) and 9 (n=30) send "sensor:a"; only device 9 sends "shared";
    # "sensor:b" is sent by nobody and keeps its value.
    r1 = host_result([9], [30], {"sensor:a": [[4.0, 0.0]], "shared": [[8.0]]},
                 {"sensor:a": [0], "shared": [0]})
    r2 = host_result([4], [10], {"sensor:a": [[0.0, 4.0]]}, {"sensor:a": [0]})
    batch = merge_results([r1, r2])
    assert batch.device_ids.tolist() == [4, 9]
    params = {"sensor:a": np.zeros(2, np.float32), "sensor:b": np.array([7.0], np.float32),
              "shared": np.zeros(1, np.float32)}
    out = FedAvg(None).aggregate(params, batch, AggregationContext(1, ("a", "b"), None, 0))
    np.testing.assert_array_equal(out["sensor:a"], [3.0, 1.0])   # (30*4 + 10*0)/40, (10*4)/40
    np.testing.assert_array_equal(out["shared"], [8.0])
    np.testing.assert_array_equal(out["sensor:b"], [7.0])
    assert params["sensor:a"].tolist() == [0.0, 0.0]  # input not mutated


def _relief_model() -> tuple:
    """RELIEF's hand case: F = 1, E_acc = E_gyro = 1 (identity encoders on one-number inputs),
    the fusion layer's first weight split per sensor (`model.fusion_blocks: sensor`)."""
    net = MultimodalNet(("acc", "gyro"), {"acc": (1,), "gyro": (1,)}, 2,
                        ModelSpec(encoder="identity", fusion_dim=1, fusion_blocks="sensor"))
    with torch.no_grad():
        for p in net.parameters():
            p.fill_(0.5)
    return net, GroupLayout(net)


def _returned(net, layout, w_acc: float, w_gyro: float, rest: float) -> dict:
    """What a device's model flattens to after local training: its blocks and `rest` in every
    shared parameter (fusion bias, task head)."""
    with torch.no_grad():
        net.fusion.blocks["acc"].fill_(w_acc)
        net.fusion.blocks["gyro"].fill_(w_gyro)
        for p in (net.fusion.bias, net.head.weight, net.head.bias):
            p.fill_(rest)
    return layout.flatten(net)


def _relief_round(holds: dict[int, tuple[bool, bool]], returns: dict[int, dict],
                  n: dict[int, int]) -> dict:
    """One cohort-wise aggregation through the real layout and `fedavg`: each device sends the
    groups `training.upload: held` gives it (`traffic.device_groups`)."""
    net, layout = _relief_model()
    received = layout.flatten(net)
    rows: dict[str, list] = {}
    senders: dict[str, list] = {}
    ids = sorted(holds)
    for pos, i in enumerate(ids):
        for g in device_groups(np.array(holds[i]), ("acc", "gyro"), tuple(layout.groups),
                               "held"):
            rows.setdefault(g, []).append(returns[i][g])
            senders.setdefault(g, []).append(pos)
    batch = merge_results([host_result(ids, [n[i] for i in ids], rows, senders)])
    out = FedAvg(None).aggregate(received, batch,
                                 AggregationContext(1, ("acc", "gyro"), None, 0))
    layout.load(net, out)
    return {"acc": float(net.fusion.blocks["acc"].item()),
            "gyro": float(net.fusion.blocks["gyro"].item()),
            "bias": float(net.fusion.bias.item())}


def test_relief_cohort_wise_aggregation_by_hand():
    """RELIEF (docs/methods/relief.md): received W = [0.5, 0.5]; device A holds both sensors,
    n_A = 10, returns [1, 2]; device B holds the accelerometer only, n_B = 30, returns 3 for
    its column (its gyroscope column is not sent). W_acc = (10·1 + 30·3)/40 = 2.5,
    W_gyro = 2 (A alone); the shared bias over both: (10·0.2 + 30·0.6)/40 = 0.5."""
    net, layout = _relief_model()
    a = _returned(net, layout, 1.0, 2.0, 0.2)
    b = _returned(net, layout, 3.0, 0.5, 0.6)
    got = _relief_round({0: (True, True), 1: (True, False)}, {0: a, 1: b}, {0: 10, 1: 30})
    assert got == pytest.approx({"acc": 2.5, "gyro": 2.0, "bias": 0.5}, abs=1e-7)
    # a round where nobody holds the gyroscope keeps its block as received
    got = _relief_round({1: (True, False)}, {1: b}, {1: 30})
    assert got == pytest.approx({"acc": 3.0, "gyro": 0.5, "bias": 0.6}, abs=1e-7)


def test_relief_blocks_differ_from_plain_averaging_of_the_whole_layer():
    """Without the split the whole W is in `shared`: B's unchanged gyroscope column (0.5) is
    averaged in, W_gyro = (10·2 + 30·0.5)/40 = 0.875."""
    net = MultimodalNet(("acc", "gyro"), {"acc": (1,), "gyro": (1,)}, 2,
                        ModelSpec(encoder="identity", fusion_dim=1))
    layout = GroupLayout(net)
    assert layout.groups == ["shared"]

    def returned(w: list[float]) -> np.ndarray:
        with torch.no_grad():
            net.fusion[0].weight.copy_(torch.tensor([w]))
        return layout.flatten(net)["shared"]

    batch = merge_results([host_result([0, 1], [10, 30], {
        "shared": [returned([1.0, 2.0]), returned([3.0, 0.5])]}, {"shared": [0, 1]})])
    out = FedAvg(None).aggregate(layout.flatten(net), batch,
                                 AggregationContext(1, ("acc", "gyro"), None, 0))
    layout.load(net, out)
    assert net.fusion[0].weight.tolist()[0] == pytest.approx([2.5, 0.875])
