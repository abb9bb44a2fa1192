"""Evaluation of a global model on the pooled test split, under chosen sensor subsets.

"Restricted to sensors S" means every other sensor's input is zeroed, exactly as a device
lacking those sensors would see it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from raymm.data.base import Split
from raymm.data.mapped import tensor_view
from raymm.models import RaymmNet


@dataclass(frozen=True)
class EvalResult:
    accuracy: float
    loss: float
    predictions: np.ndarray  # int64 [n]


def subset_name(sensors: tuple[str, ...]) -> str:
    return "+".join(sensors)


@torch.no_grad()
def evaluate_subset(model: RaymmNet, split: Split, sensors: tuple[str, ...],
                    batch_size: int = 2048) -> EvalResult:
    """Accuracy and loss with only `sensors` present (the others zeroed)."""
    model.eval()
    all_sensors = model.sensors
    present_row = torch.tensor([[m in sensors for m in all_sensors]], dtype=torch.float32)
    n = len(split)
    preds, loss_sum = [], 0.0
    y = tensor_view(split.y)
    for start in range(0, n, batch_size):
        stop = min(start + batch_size, n)
        xb = {m: tensor_view(split.x[m][start:stop]) if m in sensors
              else torch.zeros((stop - start,) + tuple(split.x[m].shape[1:]))
              for m in all_sensors}
        out = model(xb, present_row.expand(stop - start, -1))
        loss_sum += float(F.cross_entropy(out.logits, y[start:stop], reduction="sum"))
        preds.append(out.logits.argmax(1))
    model.train()
    p = torch.cat(preds).numpy().astype(np.int64)
    return EvalResult(float((p == split.y).mean()), loss_sum / max(n, 1), p)


class SubsetEvaluator:
    """`evaluate_subset` of one model on one split, each sensor subset run once (an evaluation
    round asks for the same subsets under several names: a tier, a single sensor, all sensors
    but one)."""

    def __init__(self, model: RaymmNet, split: Split, batch_size: int) -> None:
        self.model, self.split, self.batch_size = model, split, batch_size
        self._done: dict[tuple[str, ...], EvalResult] = {}

    def __call__(self, sensors: tuple[str, ...]) -> EvalResult:
        if sensors not in self._done:
            self._done[sensors] = evaluate_subset(self.model, self.split, sensors,
                                                  self.batch_size)
        return self._done[sensors]


def macro_f1(y_true: np.ndarray, y_pred: np.ndarray, num_classes: int) -> float:
    """Macro F1 over every class 0..num_classes-1, a class with neither true nor predicted
    samples scoring 0: sklearn's `f1_score(labels=range(C), average="macro", zero_division=0)`
    with its arithmetic (F = 2·tp / (true + predicted) in float64, then the mean), so the
    numbers are the same to the last bit (tests/unit/test_macro_f1.py). Counted with numpy:
    importing sklearn.metrics costs every server process ~90 MiB and a second."""
    t = np.asarray(y_true, dtype=np.int64).ravel()
    p = np.asarray(y_pred, dtype=np.int64).ravel()
    true_sum = np.bincount(t, minlength=num_classes)[:num_classes]
    pred_sum = np.bincount(p, minlength=num_classes)[:num_classes]
    tp = np.bincount(t[t == p], minlength=num_classes)[:num_classes]
    denom = true_sum.astype(np.float64) + pred_sum.astype(np.float64)
    empty = denom == 0.0
    denom[empty] = 1.0
    f = 2.0 * tp.astype(np.float64) / denom
    f[empty] = 0.0
    return float(np.mean(f))
