"""Training that diverged: a non-finite loss or model stops the run with a message.

An infinite learning rate (or one far too large) trains to NaN and chance accuracy; without a
check the run would go on, silently, for every remaining round. The server looks at each
round's losses and at the model aggregation produced; if either is not finite it keeps the
previous round's model, reports the devices, and the run stops after that round with its
directory complete (tables, summary, the last finite model).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from raymm.config.schema import Scenario
from raymm.errors import RaymmError


def diverged(device_ids: np.ndarray, loss: np.ndarray, params: dict[str, np.ndarray]
             ) -> list[int] | None:
    """None when the round's losses and the aggregated model are finite; else the ids of the
    devices whose loss was not (empty when only the model was, e.g. from pre-summed blocks)."""
    bad = ~np.isfinite(loss)
    if not bad.any() and all(np.isfinite(v).all() for v in params.values()):
        return None
    return [int(d) for d in device_ids[bad]]


class TrainingDiverged(RaymmError):
    """The run stopped because training produced non-finite numbers."""

    def __init__(self, round: int, devices: list[int], sc: Scenario, run_dir: Path) -> None:
        shown = ", ".join(map(str, devices[:8])) + (" ..." if len(devices) > 8 else "")
        who = f"on device(s) {shown}" if devices else "in the aggregated model"
        tr = sc.training
        super().__init__(
            f"round {round}: training diverged (non-finite loss {who}). The run stopped after "
            f"round {round}, keeping the model of round {round - 1}; its directory is complete: "
            f"{run_dir}. Lower training.lr (now {tr.lr:g}), or check training.weight_decay "
            f"({tr.weight_decay:g}), training.momentum ({tr.momentum:g}) and the data.")
