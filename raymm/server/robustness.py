"""Robustness of a global model: tier F1 over the less-equipped tiers, the accuracy lost
when one sensor is zeroed (worst-case drop), and each sensor head alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from raymm.data.mapped import tensor_view
from raymm.server.evaluation import SubsetEvaluator
from raymm.server.metrics import less_equipped, pooled_f1, worst_drop


def head_accuracies(ev: SubsetEvaluator) -> dict[str, float]:
    """Accuracy of each sensor's own head H_m(E_m(x_m)) on the evaluator's split (empty if the
    model has no per-sensor heads); the embeddings are those of the all-sensor subset."""
    model, split = ev.model, ev.split
    if model.heads is None:
        return {}
    correct = {m: 0 for m in model.sensors}
    for start, stop, out in ev.outputs(model.sensors):
        y = tensor_view(split.y[start:stop])
        for m in model.sensors:
            correct[m] += int((out.sensor_logits[m].argmax(1) == y).sum())
    return {m: c / max(len(split), 1) for m, c in correct.items()}


def robustness_metrics(ev: SubsetEvaluator, sensors: tuple[str, ...],
                       tier_sensors: Sequence[tuple[str, ...]], num_classes: int,
                       full_accuracy: float) -> dict[str, Any]:
    """Row entries of one evaluation: `tier_f1` (pooled over the less-equipped tiers),
    `acc_drop/<m>` and `worst_drop`/`worst_drop_sensor` (one sensor zeroed everywhere),
    `acc_head/<m>` (each sensor head alone). `ev` runs each sensor subset once."""
    out: dict[str, Any] = {}
    tiers = less_equipped(tier_sensors, sensors)
    out["tier_f1"] = pooled_f1(np.asarray(ev.split.y), [ev(ts).predictions for ts in tiers],
                               num_classes)
    without = {m: ev(tuple(s for s in sensors if s != m)).accuracy
               for m in sensors} if len(sensors) > 1 else {}
    for m, acc in without.items():
        out[f"acc_drop/{m}"] = full_accuracy - acc
    out["worst_drop"], out["worst_drop_sensor"] = worst_drop(full_accuracy, without)
    for m, acc in head_accuracies(ev).items():
        out[f"acc_head/{m}"] = acc
    return out
