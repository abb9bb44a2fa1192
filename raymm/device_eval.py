"""Per-device evaluation (`eval.scope: devices`): every device on its own test part.

Hosts evaluate their own devices with the model each would use (`raymm.exchange.eval_vectors`)
and return counts; the server turns the counts into the metrics below, so serial and Ray runs
compute the same numbers from the same counts.

- `accuracy` (ACC): mean over devices of local test accuracy with the sensors each holds;
- `acc_tier/<sensors>`: the same mean over each tier's devices (ACC_a, ACC_v, ...);
- `acc_multimodal` (ACC_m): the mean over devices holding two or more sensors;
- `acc_sensor/<m>` (ACC̄^(m)): mean over *every* device of its accuracy with only sensor m
  present, the others zeroed (as the spec says: every client, also those that lack m);
- `mir`: max_m ACC̄^(m) / min_m ACC̄^(m) (inf when some ACC̄^(m) is 0);
- `acc_<name>`: for each other predictor the objective offers (`eval_predict`, e.g. FedProto's
  nearest prototype, `acc_proto`), the mean over the devices it predicted for.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from raymm.messages import DeviceEval
from raymm.models import GroupLayout, MultimodalNet
from raymm.models.network import ModelOutput

#: an objective's `eval_predict(out, held, extras) -> {name: predictions [n]}`
ExtraPredictor = Callable[[ModelOutput, tuple[str, ...], dict[str, torch.Tensor]],
                          dict[str, torch.Tensor]]


@torch.no_grad()
def evaluate_device(model: MultimodalNet, layout: GroupLayout, vectors: dict[str, np.ndarray],
                    xs: dict[str, torch.Tensor], y: torch.Tensor, held: np.ndarray,
                    use_adapter: bool = False, predict: ExtraPredictor | None = None,
                    extras: dict[str, torch.Tensor] | None = None
                    ) -> tuple[int, float, np.ndarray, dict[str, int]]:
    """(correct with held sensors, summed loss, correct with each single sensor, correct of
    each extra predictor with held sensors) on one device.

    `xs` holds every sensor's real inputs for the device's test samples; a sensor outside the
    evaluated subset is zeroed and masked, exactly as in training. `predict` (the objective's
    `eval_predict`) sees the held-sensor output and the evaluation `extras`.
    """
    layout.load(model, vectors)
    model.eval()
    full = _forward(model, xs, held, use_adapter)
    out = full.logits
    correct = int((out.argmax(1) == y).sum())
    loss = float(F.cross_entropy(out, y, reduction="sum"))
    only = _only_correct(model, xs, y, np.ones(len(xs), bool), use_adapter)
    more: dict[str, int] = {}
    if predict is not None:
        names = tuple(m for m, h in zip(xs, held) if h)
        more = {k: int((p == y).sum()) for k, p in predict(full, names, extras or {}).items()}
    model.train()
    return correct, loss, only, more


def _forward(model: MultimodalNet, xs: dict[str, torch.Tensor], mask: np.ndarray,
             use_adapter: bool) -> ModelOutput:
    """The model on `xs` with the sensors outside `mask` zeroed and marked absent, exactly as
    in training."""
    n = int(next(iter(xs.values())).shape[0])
    xb = {m: x if mask[j] else torch.zeros_like(x) for j, (m, x) in enumerate(xs.items())}
    present = torch.from_numpy(mask.astype(np.float32)).expand(n, -1)
    return model(xb, present, use_adapter=use_adapter)


def _only_correct(model: MultimodalNet, xs: dict[str, torch.Tensor], y: torch.Tensor,
                  which: np.ndarray, use_adapter: bool) -> np.ndarray:
    """int64 [M]: correct predictions with only sensor j present, for each j in `which`; -1
    for the others (not evaluated)."""
    eye = np.eye(len(xs), dtype=bool)
    return np.array([int((_forward(model, xs, eye[j], use_adapter).logits.argmax(1) == y).sum())
                     if which[j] else -1 for j in range(len(xs))], dtype=np.int64)


@torch.no_grad()
def unimodal_correct(model: MultimodalNet, layout: GroupLayout, vectors: dict[str, np.ndarray],
                     xs: dict[str, torch.Tensor], y: torch.Tensor, which: np.ndarray
                     ) -> np.ndarray:
    """int32 [M]: a device's correct predictions on (its own) samples `xs`, `y` with only
    sensor j present, for each j in `which` (-1 elsewhere): the per-modality report an
    adaptive chain asks participants for (`raymm.messages.MODALITY_CORRECT`). One forward pass
    per reported sensor; the model is left in training mode."""
    layout.load(model, vectors)
    model.eval()
    out = _only_correct(model, xs, y, which, use_adapter=False)
    model.train()
    return out.astype(np.int32)


def merge_evals(parts: list[DeviceEval]) -> DeviceEval:
    ids = np.concatenate([p.device_ids for p in parts])
    o = np.argsort(ids, kind="stable")
    names = sorted({k for p in parts for k in p.extra_correct})
    extra = {k: np.concatenate([p.extra_correct.get(k, np.full(p.device_ids.shape, -1))
                                for p in parts])[o].astype(np.int64) for k in names}
    return DeviceEval(ids[o], np.concatenate([p.n_test for p in parts])[o],
                      np.concatenate([p.correct for p in parts])[o],
                      np.concatenate([p.loss_sum for p in parts])[o],
                      np.concatenate([p.correct_only for p in parts])[o], extra)


def device_metrics(parts: list[DeviceEval], tier: np.ndarray,
                   tier_sensors: tuple[tuple[str, ...], ...],
                   sensors: tuple[str, ...]) -> dict[str, Any]:
    """ACC, per-tier ACC, ACC_m, per-sensor ACC̄^(m) and MIR from the hosts' counts."""
    ev = merge_evals(parts)
    ok = ev.n_test > 0
    n = np.maximum(ev.n_test, 1)
    acc = ev.correct / n
    dev_tier = tier[ev.device_ids]
    out: dict[str, Any] = {
        "accuracy": _mean(acc[ok]),
        "test_loss": float(ev.loss_sum[ok].sum() / max(int(ev.n_test[ok].sum()), 1)),
    }
    for k, ts in enumerate(tier_sensors):
        out[f"acc_tier/{'+'.join(ts)}"] = _mean(acc[ok & (dev_tier == k)])
    multi = np.array([len(tier_sensors[k]) > 1 for k in dev_tier], dtype=bool)
    out["acc_multimodal"] = _mean(acc[ok & multi])
    per = [_mean(ev.correct_only[ok, j] / n[ok]) for j in range(len(sensors))]
    for m, a in zip(sensors, per):
        out[f"acc_sensor/{m}"] = a
    out["mir"] = modality_imbalance_ratio(per)
    for what, c in ev.extra_correct.items():
        has = ok & (c >= 0)
        out[f"acc_{what}"] = _mean(c[has] / n[has])
    out["devices_evaluated"] = int(ok.sum())
    return out


def modality_imbalance_ratio(per_sensor: list[float]) -> float:
    """max / min of the per-sensor accuracies (NaN entries ignored; inf if the min is 0)."""
    vals = [v for v in per_sensor if v == v]
    if not vals:
        return float("nan")
    lo = min(vals)
    return float("inf") if lo == 0 else max(vals) / lo


def _mean(x: np.ndarray) -> float:
    return float(x.mean()) if x.size else float("nan")
