"""Which groups each device receives and sends, and what that costs (raymm.protocol.traffic):
by hand, as the server counts a round, and the bytes a TIDE round puts on the wire (partial
models, prototypes, class means)."""

import numpy as np

from raymm.app.build import build_world, load_scenario
from raymm.device.host import DeviceHost
from raymm.protocol.traffic import device_groups, downlink_bytes, group_receivers
from raymm.server.server import Server
from raymm.sim.serial import SerialExecutor

from helpers import tiny_scenario

SENSORS = ("a", "b")
ACTIVE = ("sensor:a", "sensor:b", "shared")


def test_device_groups_all_vs_held():
    held = np.array([True, False])
    assert device_groups(held, SENSORS, ACTIVE, "all") == list(ACTIVE)
    assert device_groups(held, SENSORS, ACTIVE, "held") == ["sensor:a", "shared"]
    assert device_groups(held, SENSORS, ("sensor:b",), "held") == []


def test_downlink_bytes_by_hand():
    mask = np.array([[True, True], [True, False], [False, True]])
    sizes = {"sensor:a": 10, "sensor:b": 20, "shared": 5}
    assert downlink_bytes(mask, SENSORS, ACTIVE, "all", sizes).tolist() == [140] * 3
    # held: both -> (10+20+5)*4; a-only -> (10+5)*4 + 8 bytes of frozen b embedding
    assert downlink_bytes(mask, SENSORS, ACTIVE, "held", sizes, 8).tolist() == [140, 68, 108]
    recv = group_receivers(mask, SENSORS, ACTIVE, "held")
    assert recv["sensor:b"].tolist() == [True, False, True]


def test_server_counts_what_was_sent():
    for upload in ("all", "held"):
        sc = load_scenario(tiny_scenario(**{"training.upload": upload, "rounds": 1}))
        world = build_world(sc)
        ex = SerialExecutor()
        ex.start(world)
        plan, bcast = ex.plan(1, ex.poll(1))
        results = ex.train(1, (plan, bcast))
        stats = ex.aggregate(1, (plan, bcast), results).row
        sizes = ex.server.layout.sizes
        mask = world.population.sensor_mask[plan.selected]
        expected_up = 0
        for row in mask:
            expected_up += 4 * sum(sizes[g] for g in device_groups(row, SENSORS, ACTIVE, upload))
        assert stats["bytes_up"] == expected_up
        frozen = 4 * sc.model.embed_dim
        assert stats["bytes_down"] == int(downlink_bytes(mask, SENSORS, ACTIVE, upload, sizes,
                                                         frozen).sum())
        if upload == "held":
            assert stats["bytes_up"] < 4 * sum(sizes.values()) * len(plan.selected)


# --------------------------------------------------------------------------- bytes on the wire

TINY = {
    "name": "tiny_tide", "seed": 3, "rounds": 4, "method": "tide",
    "dataset": {"name": "synthetic", "classes": 2, "n_train": 60, "n_test": 20,
                "sensors": {"a": {"dim": 4, "informativeness": 1.0},
                            "b": {"dim": 3, "informativeness": 1.0}}},
    "population": {"devices": 6, "partition": {"kind": "iid"},
                   "tiers": [{"sensors": ["a", "b"], "count": 2}, {"sensors": ["a"], "count": 2},
                             {"sensors": ["b"], "count": 2}]},
    "model": {"encoder": "mlp", "embed_dim": 2, "hidden": 3, "fusion_dim": 4},
    "training": {"local_epochs": 1, "batch_size": 8},
    "selection": {"k": 6},
    "aggregation": {"warmup": 0},
    "execution": {"executor": "serial"},
    "output": {"tensorboard": False},
}


def one_round_bytes(raw: dict, prototypes: bool) -> tuple[Server, dict, np.ndarray]:
    world = build_world(load_scenario(raw))
    server = Server(world.scenario, world.dataset, world.population, world.policies)
    if prototypes:  # as if earlier rounds had produced a prototype for class 0
        server.policies.aggregator.load_state_dict(
            {"prototypes": np.zeros((2, 4), np.float32), "has_prototype": np.array([True, False])})
    host = DeviceHost(np.arange(6), world.population, world.dataset, world.host_spec)
    plan, bcast = server.plan(1, [host.report_online(1)])
    stats = server.aggregate(1, plan, [host.train(plan, bcast)]).row
    return server, stats, world.population.tier


def test_bytes_of_partial_models_prototypes_and_class_means() -> None:
    server, stats, tier = one_round_bytes(TINY, prototypes=True)
    # sensor:a = Linear(4,3) 15 + Linear(3,2) 8 + aux head Linear(2,2) 6; sensor:b = 12 + 8 + 6;
    # shared = fusion Linear(4,4) 20 + head Linear(4,2) 10; the adapter (22) never travels
    assert server.layout.sizes == {"sensor:a": 29, "sensor:b": 26, "shared": 30, "local": 22}
    # extras each way: prototypes 2×4 + mask 2 (down), class means 2×4 + counts 2 (up): 40 B
    down = {0: (29 + 26 + 30) * 4 + 40,          # both sensors
            1: (29 + 30) * 4 + 2 * 4 + 40,       # a only: + the frozen zero-input embedding of b
            2: (26 + 30) * 4 + 2 * 4 + 40}       # b only
    up = {0: (29 + 26 + 30) * 4 + 40, 1: (29 + 30) * 4 + 40, 2: (26 + 30) * 4 + 40}
    assert sorted(np.bincount(tier).tolist()) == [2, 2, 2]
    assert stats["bytes_down"] == 2 * sum(down.values()) == 1872
    assert stats["bytes_up"] == 2 * sum(up.values()) == 1840
    assert stats["bytes_total"] == 1872 + 1840


def test_bytes_of_plain_averaging_without_extras() -> None:
    raw = dict(TINY, method="tide_core")
    server, stats, _ = one_round_bytes(raw, prototypes=False)
    assert server.layout.sizes == {"sensor:a": 23, "sensor:b": 20, "shared": 30, "local": 22}
    assert stats["bytes_down"] == stats["bytes_up"] == 6 * (23 + 20 + 30) * 4
