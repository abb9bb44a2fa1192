"""The gradient of a lock-step step, every device's at once, picked once per program.

Devices share no parameters, so the gradient of the sum of the devices' losses with respect to
a device's stacked parameters is that device's own gradient: `vmap_autograd` runs
`LocalUpdate.loss` under `vmap` (one loss per device) and takes one `torch.autograd.grad` of
their sum. One plain reverse pass through the batched operations costs far less than
`vmap(grad(loss))`, whose per-operation transform was most of a step's time at these model
sizes. Encoders that `LockstepEncoder` knows run before the vmapped loss, as their own calls on
the device-stacked tensors (`_outside_vmap`); an objective's loss after the encoders written
out by hand (`raymm.protocol.fast_paths`) replaces the vmapped loss (`_closed_step`), and the
engine's own closed form of a whole model (`raymm.training.lockstep.closed_form`) replaces
autograd altogether.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, MutableMapping
from typing import Protocol

import torch
from torch import Tensor, nn
from torch.func import vmap

from raymm.models.network import RaymmNet
from raymm.protocol.fast_paths import ClosedFormLoss
from raymm.training._kernels.lockstep_encoder import LockstepEncoder, encode_devices
from raymm.training._kernels.module_call import ModuleCall
from raymm.training.local_update import Batch, GradFn, Grads, LocalUpdate, Params


class EncoderPlan(Protocol):
    """Sensors whose encoder runs outside the model for some devices of a lock-step program
    (`raymm.training.lockstep.encoders.SensorEncoders`)."""

    def embeddings(self, params: Params, x: Mapping[str, Tensor], k: int
                   ) -> dict[str, Tensor]: ...

    def zero_grads(self, grads: MutableMapping[str, Tensor | None], params: Params) -> None: ...


def vmap_autograd(update: LocalUpdate, call: ModuleCall, anchor: Params, shared: Params,
                 frozen: Params, local: Params, keeps: Mapping[str, Tensor] | None = None,
                 encoders: EncoderPlan | None = None,
                 closed: ClosedFormLoss | None = None,
                 encoder_params: Mapping[str, list[str]] | None = None) -> GradFn:
    """The loss and gradients of a bucket's minibatch, every device's at once: `params`,
    `anchor`, `frozen` (untrained but per device), `local` and the batch are stacked
    along the device axis; `shared` (untrained, the same for all) is not. `keeps`: per
    parameter that not every device trains, bool [G] (True: the device trains it); the
    others' gradients are zero, so an optimizer without weight decay leaves their values
    exactly as they were. `encoders`: sensors whose encoder only some devices run on their
    data (the others lack the sensor and do not train it). `closed`: the objective's loss
    after the encoders in closed form (`raymm.protocol.fast_paths`), which then takes the
    place of the model's fusion and heads and of `loss` under `vmap`, the encoders running
    before it (`encode_devices`; `encoder_params`: each sensor's encoder's parameter
    names), their gradients from the embeddings' by autograd. Without one, the encoders
    `LockstepEncoder` knows run before the vmapped loss too (`_outside_vmap`)."""
    return _ManyDevices(update, call, anchor, shared, frozen, local, keeps or {}, encoders,
                        closed, encoder_params or {})


class _ManyDevices:
    """`vmap_autograd`'s gradient function: state kept from step to step (each prefix's rows,
    the rows to drop, the encoders run outside vmap, fixed at the first step)."""

    def __init__(self, update: LocalUpdate, call: ModuleCall, anchor: Params, shared: Params,
                 frozen: Params, local: Params, keeps: Mapping[str, Tensor],
                 encoders: EncoderPlan | None, closed: ClosedFormLoss | None,
                 encoder_params: Mapping[str, list[str]]) -> None:
        self.update, self.call, self.shared, self.keeps = update, call, shared, keeps
        self.encoders, self.closed, self.encoder_params = encoders, closed, encoder_params
        # the proximal term a closed-form loss leaves to the program
        self.prox = update.proximal_in_loss(anchor) if closed is not None else (0.0, ())
        self.losses_of = vmap(self._one)
        self.stacked = (anchor, frozen, local)
        self.rows: dict[int, tuple[Params, ...]] = {}  # their first k devices' rows, by k
        self.drops: dict[int, dict[str, Tensor]] = {}
        # with a closed-form loss autograd differentiates the encoders only
        self.graded = None if closed is None else \
            {n for names in encoder_params.values() for n in names}
        self.outside: dict[str, tuple[nn.Module, list[str]]] | None = None  # by the first step

    def _one(self, train: Params, anc: Params, frz: Params, loc: Params, batch: Batch,
             emb: Params) -> Tensor:
        return self.update.loss(train, anc, {**self.shared, **frz}, loc, batch, emb)

    def __call__(self, params: Params, batch: Batch) -> tuple[Tensor, Grads]:
        # d(sum of the devices' losses)/d(device d's parameters) = device d's gradient
        leaves = {n: p.detach().requires_grad_(True) if self.graded is None or n in self.graded
                  else p for n, p in params.items()}
        k = len(batch.y)   # the first k devices have this minibatch (`LocalUpdate.run`)
        if k not in self.rows:
            self.rows[k] = tuple({n: t[:k] for n, t in d.items()} for d in self.stacked)
        emb, batch = self._embeddings(leaves, batch, k)
        gs: dict[str, Tensor | None]
        if self.closed is not None:
            loss, gs = _closed_step(self.update, self.closed, leaves, emb, batch,
                                    self.rows[k][0], self.prox)
        else:
            loss = self.losses_of(leaves, *self.rows[k], batch, emb)
            gs = dict(zip(leaves, torch.autograd.grad(loss.sum(), list(leaves.values()),
                                                      allow_unused=True)))
        if self.encoders is not None:
            self.encoders.zero_grads(gs, leaves)
        for n, drop in self._dropped_rows(k).items():
            g = gs.get(n)
            if g is not None:
                gs[n] = g.index_fill(0, drop, 0.0)
        return loss.detach(), gs

    def _embeddings(self, leaves: Params, batch: Batch, k: int
                    ) -> tuple[dict[str, Tensor], Batch]:
        """The embeddings made before the step: the batch's own, those of the encoders only
        some devices run (`encoders`) and those run outside vmap; they reach the model as
        `emb` (vmap takes no None)."""
        emb, batch = dict(batch.embeddings or {}), batch._replace(embeddings={})
        if self.encoders is not None:
            emb.update(self.encoders.embeddings(leaves, batch.x, k))
        if self.outside is None:
            self.outside = _outside_vmap(self.update, self.call, self.encoder_params, leaves,
                                         self.closed is not None)
        for m, (encoder, names) in self.outside.items():
            if m not in emb:
                emb[m] = encode_devices(self.call, encoder, {n: leaves[n] for n in names},
                                        batch.x[m])
        return emb, batch

    def _dropped_rows(self, k: int) -> dict[str, Tensor]:
        """Per parameter some of the first k devices do not train: those devices. Their
        gradient rows are zeroed by index, a few contiguous rows each, not by a
        broadcast mask over the whole gradient (several times slower on a CPU)."""
        if k not in self.drops:
            idx = {n: (~keep[:k]).nonzero().flatten() for n, keep in self.keeps.items()}
            self.drops[k] = {n: i for n, i in idx.items() if i.numel()}
        return self.drops[k]


def _outside_vmap(update: LocalUpdate, call: ModuleCall, encoder_names: Mapping[str, list[str]],
                  params: Params, closed: bool) -> dict[str, tuple[nn.Module, list[str]]]:
    """Sensor -> (encoder, its parameter names) for the encoders a lock-step step runs
    before the loss (`encode_devices`), the model taking their embeddings: every read
    sensor's with a closed-form loss; else those that `LockstepEncoder` runs without vmap,
    every weight trained (the same bits as inside the loss's vmap, less vmap's layers)."""
    model = call.model
    if not isinstance(model, RaymmNet) or not model.takes_embeddings:
        assert not closed   # a loss after the encoders asks for embeddings
        return {}
    encoders = model.encoders
    assert isinstance(encoders, nn.ModuleDict)   # `takes_embeddings` promises them
    return {m: (encoders[m], list(encoder_names[m])) for m in model.sensors
            if m not in update.unread and m in encoder_names
            and (closed or (set(encoder_names[m]) <= params.keys()
                            and LockstepEncoder.of(call, encoders[m]) is not None))}


def _closed_step(update: LocalUpdate, closed: ClosedFormLoss, leaves: Params,
                 emb: dict[str, Tensor], batch: Batch, anchor: Params,
                 prox: tuple[float, tuple[str, ...]]) -> tuple[Tensor, dict[str, Tensor | None]]:
    """`vmap_autograd`'s step through a closed-form loss: every sensor's embeddings (the
    given ones, zeros for the unread; `emb` holds the rest), the loss and gradients from
    `closed`, the encoders' gradients by autograd from the embeddings', and the proximal
    term `prox` where the loss would hold it."""
    assert batch.weight is not None   # a lock-step minibatch
    k, rows = batch.y.shape
    for m in update.unread:
        emb[m] = torch.zeros((k, rows, update.unread[m]), device=batch.y.device)
    with torch.no_grad():
        loss, head, d_emb = closed(leaves, emb, batch.y, batch.present, batch.weight,
                                   update.extras)
    grads: dict[str, Tensor | None] = dict.fromkeys(leaves)
    grads.update(head)
    reached = [m for m in d_emb if emb[m].requires_grad]
    wanted = [n for n, p in leaves.items() if n not in head and p.requires_grad]
    if reached and wanted:
        found = torch.autograd.grad([emb[m] for m in reached], [leaves[n] for n in wanted],
                                    grad_outputs=[d_emb[m] for m in reached],
                                    allow_unused=True)
        grads.update(zip(wanted, found))
    c, names = prox
    if c:   # the step is written out here: nothing of the term is to be differentiated
        with torch.no_grad():
            loss = add_proximal(loss, grads, leaves, anchor, c, names, fresh=False)
    return loss, grads


def add_proximal(loss: Tensor, grads: dict[str, Tensor | None], params: Params,
                 anchor: Params, c: float, names: Iterable[str], *, fresh: bool) -> Tensor:
    """A proximal term c·||θ - θ_received||² over `names` added to a hand-written step of
    stacked devices: its gradient 2c(θ - θ_received) to `grads`, its value to each device's
    `loss` [k], which is returned. `fresh`: every gradient is a tensor of the caller's own
    making, no view and shared with no other, so the term is added into its memory; else
    (gradients from `torch.autograd.grad`, which may be views of a buffer autograd made, or one
    tensor handed to two parameters) each gets a new tensor, the same numbers."""
    for n in names:
        diff = params[n] - anchor[n]
        g = grads.get(n)
        grads[n] = diff.mul(2 * c) if g is None else \
            g.add_(diff, alpha=2 * c) if fresh else g.add(diff, alpha=2 * c)
        loss = loss + c * diff.square().flatten(1).sum(1)
    return loss
