"""Warm a freshly built host up before its first timed round.

The first lock-step training call in a process pays one-time costs that have nothing to do with
the round: torch.func's vmap sets itself up, each operator of the model dispatches
for the first time (kernels chosen, caches filled), and the allocator grows its pools. A
DeviceActor runs `warm_up` right after building its host, while the driver and the server are
still preparing round 1, so round 1's wall time is a steady round's.

Results never change: the pass runs on zero inputs through `functional_call` with copies of the
parameters (the module's own weights, gradients and the host's device state are untouched), and
the global torch random state is restored afterwards (a model with dropout draws from it).
Both run what the lock-step path runs (`raymm.training.local_update`: the loss under `vmap`, then
one
`torch.autograd.grad` of the devices' summed losses). `warm_up_transforms` is the part that
needs no host: an actor runs it in its constructor, while the driver loads the data.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.func import functional_call, vmap

from raymm.device.host import DeviceHost

#: devices and samples per device of the warm-up batch: small, but batched like a real chunk
DEVICES, SAMPLES = 2, 2


def warm_up_transforms() -> None:
    """Gradients of a vmapped tiny linear map: vmap's one-time set-up, no model needed."""
    with torch.random.fork_rng(devices=[]):
        w = torch.zeros(DEVICES, 2, 2, requires_grad=True)
        x = torch.zeros(DEVICES, SAMPLES, 2)

        def loss(wi: Tensor, xi: Tensor) -> Tensor:
            return (xi @ wi).square().mean()

        torch.autograd.grad(vmap(loss)(w, x).sum(), [w])


def warm_up(host: DeviceHost) -> None:
    """One vmapped forward/backward of the host's model on dummy input; nothing for a model
    that never trains in lock-step (buffers such as batch norm's, which a forward pass in
    training mode would also change)."""
    trainer = host.trainer
    model, dataset, device = trainer.model, trainer.dataset, trainer.accelerator
    if any(True for _ in model.buffers()):
        return
    sensors = dataset.sensors
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        params = {n: p.detach().clone() for n, p in model.named_parameters()}
        stacked = {n: p.unsqueeze(0).expand((DEVICES,) + p.shape).clone().requires_grad_(True)
                   for n, p in params.items()}
        xs = {m: torch.zeros((DEVICES, SAMPLES) + dataset.sensor_shape(m), device=device)
              for m in sensors}
        present = torch.ones(DEVICES, SAMPLES, len(sensors), device=device)
        y = torch.zeros(DEVICES, SAMPLES, dtype=torch.long, device=device)

        def loss(p: dict[str, Tensor], x: dict[str, Tensor], pr: Tensor, yy: Tensor) -> Tensor:
            out = functional_call(model, p, (x, pr))
            return F.cross_entropy(out.logits, yy)

        grads = torch.autograd.grad(vmap(loss)(stacked, xs, present, y).sum(),
                                    list(stacked.values()), allow_unused=True)
        for g in grads:
            if g is not None:
                g.sum().item()  # wait for the device (a GPU runs asynchronously)
