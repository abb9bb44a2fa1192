import numpy as np

from raymm.app.build import build_world, load_scenario
from raymm.protocol.traffic import device_groups, downlink_bytes, group_receivers
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
