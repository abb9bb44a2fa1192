"""Per-device evaluation on hosts (`eval.scope: devices`): every device on its own test part,
with the model it would use, returned as counts (`raymm.server.device_metrics` turns them
into metrics, so serial and Ray runs compute the same numbers from the same counts).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

from raymm.models import GroupLayout, RaymmNet
from raymm.models.masked import MaskedForward, evaluating
from raymm.models.network import ModelOutput

#: an objective's `eval_predict(out, held, extras) -> {name: predictions [n]}`
ExtraPredictor = Callable[[ModelOutput, tuple[str, ...], dict[str, torch.Tensor]],
                          dict[str, torch.Tensor]]


@torch.no_grad()
def evaluate_device(model: RaymmNet, layout: GroupLayout, vectors: dict[str, np.ndarray],
                    xs: dict[str, torch.Tensor], y: torch.Tensor, held: np.ndarray,
                    use_adapter: bool = False, predict: ExtraPredictor | None = None,
                    extras: dict[str, torch.Tensor] | None = None
                    ) -> tuple[int, float, np.ndarray, dict[str, int]]:
    """(correct with held sensors, summed loss, correct with each single sensor, correct of
    each extra predictor with held sensors) on one device.

    `xs` holds every sensor's real inputs for the device's test samples; a sensor outside the
    evaluated subset is zeroed and masked, exactly as in training (`MaskedForward`: each
    sensor's encoder runs once on real inputs and once on zeros for all these passes).
    `predict` (the objective's `eval_predict`) sees the held-sensor output and the evaluation
    `extras`. Evaluating many devices, wrap the loop in `evaluating(model)`.
    """
    layout.load(model, vectors)
    with evaluating(model):
        passes = MaskedForward(model, xs)
        full = passes(held, use_adapter)
        out = full.logits
        correct = int((out.argmax(1) == y).sum())
        loss = float(F.cross_entropy(out, y, reduction="sum"))
        only = _only_correct(passes, y, np.ones(len(xs), bool), use_adapter)
        more: dict[str, int] = {}
        if predict is not None:
            names = tuple(m for m, h in zip(xs, held) if h)
            more = {k: int((p == y).sum())
                    for k, p in predict(full, names, extras or {}).items()}
    return correct, loss, only, more


def _only_correct(passes: MaskedForward, y: torch.Tensor, which: np.ndarray,
                  use_adapter: bool) -> np.ndarray:
    """int64 [M]: correct predictions with only sensor j present, for each j in `which`; -1
    for the others (not evaluated)."""
    eye = np.eye(len(which), dtype=bool)
    return np.array([int((passes(eye[j], use_adapter).logits.argmax(1) == y).sum())
                     if which[j] else -1 for j in range(len(which))], dtype=np.int64)


@torch.no_grad()
def unimodal_correct(model: RaymmNet, layout: GroupLayout, vectors: dict[str, np.ndarray],
                     xs: dict[str, torch.Tensor], y: torch.Tensor, which: np.ndarray
                     ) -> np.ndarray:
    """int32 [M]: a device's correct predictions on (its own) samples `xs`, `y` with only
    sensor j present, for each j in `which` (-1 elsewhere): the per-modality report an
    adaptive chain asks participants for (`raymm.protocol.messages.MODALITY_CORRECT`). One forward
    pass per reported sensor; the model is left in training mode."""
    layout.load(model, vectors)
    with evaluating(model):
        out = _only_correct(MaskedForward(model, xs), y, which, use_adapter=False)
    return out.astype(np.int32)
