"""Joint training: every group active every round, every online device eligible."""

from __future__ import annotations

import numpy as np

from raymm.protocol.registry import SCHEDULES
from raymm.protocol.seams import Schedule


@SCHEDULES.register("joint")
class Joint(Schedule):
    """Every parameter group trains every round; every online device may be selected."""

    def __init__(self, params: object) -> None:
        self.params = params

    def active_groups(self, round: int, groups: list[str]) -> tuple[str, ...]:
        return tuple(groups)

    def eligible(self, round: int, sensor_mask: np.ndarray,
                 sensors: tuple[str, ...]) -> np.ndarray:
        return np.ones(sensor_mask.shape[0], dtype=bool)

    def phase(self, round: int) -> str:
        return "joint"
