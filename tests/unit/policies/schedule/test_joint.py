"""Joint training (policies.schedule.joint): every group active every round, every device
eligible."""

from __future__ import annotations

import numpy as np

from policies.schedule.joint import Joint


def test_every_group_and_every_device_every_round() -> None:
    joint = Joint(None)
    groups = ["sensor:a", "sensor:b", "shared"]
    mask = np.array([[True, False], [False, True], [True, True]])
    for t in (1, 7):
        assert joint.active_groups(t, groups) == tuple(groups)
        assert joint.eligible(t, mask, ("a", "b")).tolist() == [True, True, True]
        assert joint.phase(t) == "joint"
