"""Headline metrics of multimodal FL under a budget: Acc@B, tier-restricted F1, worst-case drop,
per-sensor-head accuracy, and early stopping.

The pure functions work on plain numbers and round rows (dicts as written to rounds.parquet), so
they are unit-tested by hand and reused after the fact, e.g. to recompute Acc@B for a budget
chosen once every run of a sweep is done.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from raymm.data.base import Split
from raymm.evaluation import SubsetEvaluator, macro_f1
from raymm.models import MultimodalNet
from raymm.rundir import GIB


# --------------------------------------------------------------------------- pure functions


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


# --------------------------------------------------------------------------- model evaluation


@torch.no_grad()
def head_accuracies(model: MultimodalNet, split: Split, batch_size: int) -> dict[str, float]:
    """Accuracy of each sensor's own head H_m(E_m(x_m)) on the test split (empty if the model
    has no per-sensor heads)."""
    if model.heads is None:
        return {}
    n = len(split)
    correct = {m: 0 for m in model.sensors}
    present = torch.ones(1, len(model.sensors))
    model.eval()
    for start in range(0, n, batch_size):
        stop = min(start + batch_size, n)
        xb = {m: torch.from_numpy(np.asarray(split.x[m][start:stop])) for m in model.sensors}
        out = model(xb, present.expand(stop - start, -1))
        y = torch.from_numpy(np.asarray(split.y[start:stop]))
        for m in model.sensors:
            correct[m] += int((out.sensor_logits[m].argmax(1) == y).sum())
    model.train()
    return {m: c / max(n, 1) for m, c in correct.items()}


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
    for m, acc in head_accuracies(ev.model, ev.split, ev.batch_size).items():
        out[f"acc_head/{m}"] = acc
    return out


# --------------------------------------------------------------------------- run tracking


class RunTracker:
    """Follows the rows of a run: best accuracy, Acc@B and Acc@B/2 so far, early stopping.

    `update(row)` adds `best_accuracy`, `acc_at_budget`, `acc_at_half_budget` to evaluated rows
    (in place, before the row is logged) and returns True when the run should stop: `patience`
    evaluations in a row without a new best accuracy. Evaluations before round `patience_from`
    (a staged method's earlier stages, whose model is not yet the one it ends with) count for
    the best accuracy but never toward the patience.
    """

    def __init__(self, budget_gib: float | None = None, patience: int | None = None,
                 patience_from: int = 1) -> None:
        self.budget_gib = budget_gib
        self.patience = patience
        self.patience_from = patience_from
        self.best: float | None = None
        self.since_best = 0
        self.at_budget: float | None = None
        self.at_half: float | None = None

    def update(self, row: dict[str, Any]) -> bool:
        acc = row.get("accuracy")
        if acc is None:
            return False
        if self.best is None or acc > self.best:
            self.best, self.since_best = float(acc), 0
        elif row.get("round", self.patience_from) >= self.patience_from:
            self.since_best += 1
        row["best_accuracy"] = self.best
        if self.budget_gib is not None:
            spent = row["bytes_total"] / GIB
            if spent <= self.budget_gib:
                self.at_budget = max(acc, self.at_budget or -math.inf)
            if spent <= self.budget_gib / 2:
                self.at_half = max(acc, self.at_half or -math.inf)
            row["acc_at_budget"] = self.at_budget
            row["acc_at_half_budget"] = self.at_half
        return self.patience is not None and self.since_best >= self.patience


def summary_metrics(rows: Sequence[Mapping[str, Any]], budget_gib: float | None
                    ) -> dict[str, Any]:
    """Summary entries: Acc@B, Acc@B/2 and the budget; the round of the best accuracy (Final)
    and that evaluation's tier F1, worst-case drop, per-tier and per-head accuracies."""
    out: dict[str, Any] = {}
    if budget_gib is not None:
        out["budget_gib"] = budget_gib
        out["acc_at_budget"] = acc_at_budget(rows, budget_gib)
        out["acc_at_half_budget"] = acc_at_budget(rows, budget_gib / 2)
    evals = [r for r in rows if r.get("accuracy") is not None]
    if not evals:
        return out
    best = max(evals, key=lambda r: r["accuracy"])  # the earliest on a tie
    out["best_round"] = best["round"]
    for k, v in best.items():
        if k in ("tier_f1", "worst_drop", "worst_drop_sensor") or \
                k.startswith(("acc_tier/", "acc_sensor/", "acc_head/", "acc_drop/")):
            out[k if "/" not in k else f"best_{k}"] = v
    return out
