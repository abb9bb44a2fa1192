"""Evaluation of a global model on the pooled test split, under chosen sensor subsets.

"Restricted to sensors S" means every other sensor's input is zeroed, exactly as a device
lacking those sensors would see it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from raymm.data.base import Split
from raymm.data.mapped import tensor_view
from raymm.models import ModelOutput, RaymmNet
from raymm.models.masked import MaskedForward, evaluating


@dataclass(frozen=True)
class EvalResult:
    accuracy: float
    loss: float
    predictions: np.ndarray  # int64 [n]


def subset_name(sensors: tuple[str, ...]) -> str:
    return "+".join(sensors)


def evaluate_subset(model: RaymmNet, split: Split, sensors: tuple[str, ...],
                    batch_size: int = 2048) -> EvalResult:
    """Accuracy and loss with only `sensors` present (the others zeroed)."""
    return SubsetEvaluator(model, split, batch_size)(sensors)


#: the most bytes of embeddings a `SubsetEvaluator` keeps between subsets (all batches' real
#: and zero-input embeddings); a split needing more runs its encoders again for every subset
KEEP_BYTES = 256 << 20


class SubsetEvaluator:
    """`model` on one split under sensor subsets, each subset run once (an evaluation round
    asks for the same subsets under several names: a tier, a single sensor, all sensors but
    one), and each sensor's encoder once on its real inputs and once on zeros for all of them
    (`MaskedForward`, per batch of `batch_size` samples) when the split's embeddings fit in
    `KEEP_BYTES`. The model's parameters must not change while it is in use."""

    def __init__(self, model: RaymmNet, split: Split, batch_size: int) -> None:
        self.model, self.split, self.batch_size = model, split, batch_size
        self._done: dict[tuple[str, ...], EvalResult] = {}
        self._passes: dict[int, MaskedForward] = {}   # by the batch's first sample
        self._keep: bool | None = None                # None: not known before the first batch

    @torch.no_grad()
    def outputs(self, sensors: tuple[str, ...]) -> Iterator[tuple[int, int, ModelOutput]]:
        """(start, stop, the model's output) of every batch, with only `sensors` present."""
        mask = [m in sensors for m in self.model.sensors]
        n = len(self.split)
        with evaluating(self.model):
            for start in range(0, n, self.batch_size):
                stop = min(start + self.batch_size, n)
                passes = self._passes.get(start)
                if passes is None:
                    passes = MaskedForward(self.model, {m: tensor_view(self.split.x[m][start:stop])
                                                        for m in self.model.sensors})
                out = passes(mask)
                if self._keep is None:   # real and zero-input embeddings of every batch
                    per_sample = sum(e.nbytes for e in out.embeddings.values()) / (stop - start)
                    self._keep = 2 * per_sample * n <= KEEP_BYTES
                if self._keep:
                    self._passes[start] = passes
                yield start, stop, out

    def __call__(self, sensors: tuple[str, ...]) -> EvalResult:
        if sensors not in self._done:
            y = tensor_view(self.split.y)
            preds, loss_sum = [], 0.0
            for start, stop, out in self.outputs(sensors):
                loss_sum += float(F.cross_entropy(out.logits, y[start:stop], reduction="sum"))
                preds.append(out.logits.argmax(1))
            n = len(self.split)
            p = torch.cat(preds).numpy().astype(np.int64)
            self._done[sensors] = EvalResult(float((p == self.split.y).mean()),
                                             loss_sum / max(n, 1), p)
        return self._done[sensors]


def macro_f1(y_true: np.ndarray, y_pred: np.ndarray, num_classes: int) -> float:
    """Macro F1 over every class 0..num_classes-1, a class with neither true nor predicted
    samples scoring 0: sklearn's `f1_score(labels=range(C), average="macro", zero_division=0)`
    with its arithmetic (F = 2·tp / (true + predicted) in float64, then the mean), so the
    numbers are the same to the last bit (tests/unit/server/test_evaluation.py). Counted with numpy:
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
