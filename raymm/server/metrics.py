"""Headline metrics of multimodal FL under a budget, as pure functions of numbers and round
rows: Acc@B, worst-case drop, pooled tier F1. Reused after the fact, e.g. to recompute Acc@B
for a budget chosen once every run of a sweep is done.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from raymm.server.evaluation import macro_f1
from raymm.units import GIB


def acc_at_budget(rows: Sequence[Mapping[str, Any]], budget_gib: float) -> float | None:
    """Acc@B = max{Acc[t] : Ψ[t] ≤ B} over the evaluated rounds; None if none fits in B.

    Ψ[t] is the row's `bytes_total` (both directions, up to and including round t).
    """
    limit = budget_gib * GIB
    accs = [float(r["accuracy"]) for r in rows
            if r.get("accuracy") is not None and r["bytes_total"] <= limit]
    return max(accs) if accs else None


def worst_drop(full: float, without: Mapping[str, float]) -> tuple[float, str | None]:
    """Largest accuracy loss when one sensor is zeroed in every test input, and which sensor
    (the first in order on a tie). (nan, None) without any sensor to remove."""
    if not without:
        return math.nan, None
    sensor = max(without, key=lambda m: full - without[m])
    return full - without[sensor], sensor


def pooled_f1(y: np.ndarray, preds: Sequence[np.ndarray], num_classes: int) -> float:
    """Macro F1 of the predictions of several restricted evaluations, pooled: each of `preds`
    predicts the same test labels `y` and all pairs enter one confusion matrix."""
    if not preds:
        return math.nan
    return macro_f1(np.tile(y, len(preds)), np.concatenate(preds), num_classes)


def less_equipped(tier_sensors: Sequence[tuple[str, ...]], sensors: tuple[str, ...]
                  ) -> list[tuple[str, ...]]:
    """Distinct tier sensor sets that lack at least one of the global sensors, in order."""
    return [ts for ts in dict.fromkeys(tier_sensors) if set(ts) != set(sensors)]
