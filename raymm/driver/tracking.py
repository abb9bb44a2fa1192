"""Following a run's rows: best accuracy, Acc@B so far, early stopping, and what the
summary reports about the metrics and the policies' choices.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from raymm.protocol.record import WEIGHT_KEYS
from raymm.server.metrics import acc_at_budget
from raymm.units import GIB


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


def policy_summary(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """What the policies chose over the run, for summary.json.

    - `phase_order`: the schedule's phases in order, one name each (a chain's modalities, an
      adaptive chain's `probe` and revisits; `chain/phase` separates two consecutive phases of
      the same modality);
    - with adaptive selection weights (`selection/arm`): `selection_weights`, one entry per arm
      played, with its weights and the rounds it was used.
    """
    out: dict[str, Any] = {}
    runs = [(r.get("chain/phase"), r["phase"]) for r in rows if "phase" in r]
    if runs:
        out["phase_order"] = [name for i, (key, name) in enumerate(runs)
                              if i == 0 or runs[i - 1] != (key, name)]
    arms: dict[int, dict[str, Any]] = {}
    for r in rows:
        if "selection/arm" not in r:
            continue
        arm = arms.setdefault(int(r["selection/arm"]), {
            "arm": int(r["selection/arm"]), "rounds": 0,
            **{k: float(r[f"selection/{k}"]) for k in WEIGHT_KEYS}})
        arm["rounds"] += 1
    if arms:
        out["selection_weights"] = [arms[a] for a in sorted(arms)]
    return out
