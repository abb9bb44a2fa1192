"""One round's record: the row of metrics rounds.parquet holds, and what rides beside it.

The row holds only columns (numbers and short strings). What a round yields that is not a
column travels in typed fields: the selected devices (the availability picture, and
checkpoints), the pooled confusion matrix (a picture), and the devices whose training
diverged (the run stops). Writers read the fields; none of them ever becomes a column.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class RoundRecord:
    """What the server and the engine report for round `row["round"]`."""

    #: the round's metrics, in column order: what rounds.parquet, TensorBoard scalars,
    #: summary.json and an `on_round` hook see
    row: dict[str, Any] = field(default_factory=dict)
    #: int64 ids of the devices selected this round
    selected: np.ndarray | None = None
    #: int [classes, classes] counts of (true, predicted) on the pooled test split, on rounds
    #: with a pooled evaluation
    confusion: np.ndarray | None = None
    #: set when training produced non-finite numbers: the devices whose loss was not finite
    #: (empty when only the aggregated model was); the run stops after this round
    diverged: list[int] | None = None
    #: float64 [N] under privacy: each device's ε so far at the run's δ (the privacy ledger's
    #: per-device column; the row's `privacy/epsilon` is its largest value)
    device_epsilon: np.ndarray | None = None
    #: devices whose lock-step program fell back to sequential training this round, by reason
    #: (`UpdateBatch.lockstep_fallbacks`; the row's `lockstep_fallbacks` is their sum)
    lockstep_fallbacks: dict[str, int] = field(default_factory=dict)

    def merge(self, other: RoundRecord) -> None:
        """Add another part of the same round (its evaluation) to this record: its columns
        after these, and the fields it sets."""
        self.row.update(other.row)
        for name in ("selected", "confusion", "diverged", "device_epsilon"):
            if getattr(other, name) is not None:
                setattr(self, name, getattr(other, name))


#: the columns adaptive selection weights log every round (`selection/<key>`)
WEIGHT_KEYS = ("alpha", "beta", "gamma", "participation")
