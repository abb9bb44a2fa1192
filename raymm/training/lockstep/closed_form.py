"""The engine's own lock-step gradient written out by hand: a chain of `Linear` and `ReLU`
under cross-entropy, registered for the `ce` objective (`raymm.protocol.fast_paths`).

A lock-step step (`raymm.training.lockstep.gradients.vmap_autograd`) runs the loss under `vmap`
and takes one reverse pass of autograd: general, and for a small model mostly overhead. The
batched products below do the same work in a few calls per layer (docs/performance.md,
"Gradients written out").

`closed_form_grads` gives such a gradient function, or None where it does not know the model or
the loss; the caller then keeps autograd. It knows:
  * a `MultimodalNet` of one sensor whose encoder, fusion layer and task head make one chain
    of `Linear` layers with `ReLU` between them (`encoder: identity` or `mlp`, concat fusion,
    no per-sensor heads, no adapter in use), every weight trained by every device;
  * an objective whose fast path (`ClosedForm.task_cross_entropy`) says its loss is the task
    head's mean cross-entropy and, at most, its proximal term: `ce` without an adapter, so
    FedAvg and FedProx.
The numbers are the autograd path's up to float32 rounding (the products and sums run in
another order): `tests/unit/training/lockstep/test_closed_form.py` holds the gradients and
losses to it, and a device's numbers to every packing. `execution.training.closed_form: false`
keeps autograd everywhere.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from raymm.models.network import MultimodalNet
from raymm.protocol.fast_paths import ClosedForm, closed_form_for, register_closed_form
from raymm.protocol.losses import cross_entropy_with_grad
from raymm.protocol.seams import Objective
from raymm.training.local_update import Batch, GradFn, Params
from raymm.training.lockstep.gradients import add_proximal

#: `ce`'s loss is the task head's mean cross-entropy plus FedProx's term, unless it trains
#: the adapter (whose path this chain does not have)
register_closed_form("ce", ClosedForm(task_cross_entropy=lambda ce: not ce.uses_adapter))


@dataclass(frozen=True)
class Dense:
    """One `Linear` layer of the chain: its parameters' names, and whether a ReLU follows."""

    weight: str
    bias: str | None
    relu: bool


def linear_chain(model: nn.Module) -> tuple[str, list[Dense]] | None:
    """(the sensor, its layers input to logits) when `model` is one chain of `Linear` and
    `ReLU` (`Flatten` first), else None."""
    if type(model) is not MultimodalNet or len(model.sensors) != 1 or model.heads is not None \
            or model.fusion is None or model.consensus is not None:
        return None
    sensor = model.sensors[0]
    prefixed = [(f"encoders.{sensor}", model.encoders[sensor]), ("fusion", model.fusion),
                ("head", model.head)]
    layers: list[Dense] = []
    for prefix, part in prefixed:
        mods = list(part.named_children()) if isinstance(part, nn.Sequential) else [("", part)]
        for name, mod in mods:
            full = f"{prefix}.{name}" if name else prefix
            if isinstance(mod, nn.Flatten) and not layers:   # a vector input: a view
                continue
            if isinstance(mod, nn.Linear):
                layers.append(Dense(f"{full}.weight",
                                    f"{full}.bias" if mod.bias is not None else None, False))
            elif isinstance(mod, nn.ReLU) and layers and not layers[-1].relu:
                layers[-1] = Dense(layers[-1].weight, layers[-1].bias, True)
            else:
                return None
    return (sensor, layers) if layers and not layers[-1].relu else None


def closed_form_grads(model: nn.Module, objective: Objective, params: Params, anchor: Params,
                      *, proximal: tuple[float, tuple[str, ...]], plain: bool) -> GradFn | None:
    """The gradient function of a lock-step program (`gradients.vmap_autograd`'s contract:
    `(params, batch) -> (loss [k], grads)` for the first k devices), or None where this module
    does not know the model or the objective's loss (`ClosedForm.task_cross_entropy`).
    `params`/`anchor`: the program's trained stacks and their starting values; `proximal`:
    (c, names) of a c·||θ - θ_received||² over those parameters that the loss holds (c = 0:
    none, or added outside the loss, as `LockstepAdam` does); `plain`: nothing else reaches the
    forward pass (no frozen or shared parameters in the chain, no device tensors, no
    per-device masks or encoder plan, no adapter)."""
    fast = closed_form_for(objective)
    if not plain or fast is None or fast.task_cross_entropy is None \
            or not fast.task_cross_entropy(objective):
        return None
    chain = linear_chain(model)
    if chain is None:
        return None
    sensor, layers = chain
    names = {n for d in layers for n in (d.weight, d.bias) if n is not None}
    if names != set(params):
        return None
    c, prox_names = proximal
    rows: dict[int, Params] = {}   # the anchor's first k devices, by k

    def grads(params: Params, batch: Batch) -> tuple[Tensor, Mapping[str, Tensor | None]]:
        k, b = batch.y.shape
        if batch.weight is None or batch.embeddings:
            raise ValueError("a closed-form step takes a lock-step minibatch with row weights "
                             "and no given embeddings")
        with torch.no_grad():
            loss, gs = _chain_step(layers, params, batch.x[sensor].reshape(k, b, -1),
                                   batch.y, batch.weight)
            if c:
                if k not in rows:
                    rows[k] = {n: anchor[n][:k] for n in prox_names}
                loss = add_proximal(loss, gs, params, rows[k], c, prox_names, fresh=True)
        return loss, gs
    return grads


def _chain_step(layers: list[Dense], params: Params, x: Tensor, y: Tensor, weight: Tensor
                ) -> tuple[Tensor, dict[str, Tensor | None]]:
    """Forward and reverse pass of the chain on `x` [k, B, D], labels `y` [k, B] and row
    weights [k, B] (0: padding): each device's weighted mean cross-entropy [k] and the
    gradients of the stacked [k, ...] parameters."""
    acts = [x]
    for d in layers:
        w = params[d.weight]
        out = torch.bmm(acts[-1], w.transpose(1, 2)) if d.bias is None else \
            torch.baddbmm(params[d.bias].unsqueeze(1), acts[-1], w.transpose(1, 2))
        acts.append(out.relu_() if d.relu else out)
    per_row, delta = cross_entropy_with_grad(acts.pop(), y)
    count = weight.sum(dim=1)
    loss = (per_row * weight).sum(dim=1) / count
    # d loss / d logits: (softmax - one-hot) x the row's share of its device's mean
    delta.mul_((weight / count.unsqueeze(1)).unsqueeze(2))
    grads: dict[str, Tensor | None] = {}
    for i in range(len(layers) - 1, -1, -1):
        d, inp = layers[i], acts[i]
        grads[d.weight] = torch.bmm(delta.transpose(1, 2), inp)
        if d.bias is not None:
            grads[d.bias] = delta.sum(dim=1)
        if i:
            delta = torch.bmm(delta, params[d.weight])
            if layers[i - 1].relu:   # ReLU's own backward kernel: far faster than a
                # multiply by a bool mask
                delta = torch.ops.aten.threshold_backward(delta, inp, 0)
    return loss, grads
