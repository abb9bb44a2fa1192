"""Lock-step local training of many devices at once with `torch.func` (the fast path).

`raymm.local.LocalTrainer` trains one device after another and stays the reference. Here a host
trains its selected devices together: devices are grouped into *buckets* that share everything
that is Python-level structure -- the sensor set (hence the held sensors, the groups trained and
which inputs are all-zero) and the number of optimizer steps per epoch -- and each bucket runs
as one program. Trainable parameters are stacked along a leading device axis,
`functional_call` runs the one shared module on each device's slice, `vmap(grad_and_value(loss))`
gives every device's loss and gradient in one call, and a functional SGD/Adam (the same update
as `torch.optim`) moves every stack at once. The last minibatch of an epoch is shorter for some
devices than for others: it is padded to the batch size, and `LossInputs.weight` marks real rows
1 and padding 0. Minibatch order, augmentation draws and everything else random come from the
same per-device streams as the sequential path.

Agreement with the sequential path: the same updates up to float32 rounding (batched matmuls
and weighted means sum in a different order); `tests/unit/test_vectorised.py` holds it to an
absolute 1e-4 on every parameter after several rounds. A device's result does not depend on which
other devices share its bucket or chunk, so packing still does not change results.

What an objective must provide to be vectorised -- it opts in with `vectorisable = True`:
  * `loss(inp)` is a pure function of tensors that works under `torch.func.vmap` and `grad`:
    no `.item()`/`float()`, no Python branches on tensor values, no in-place updates of inputs,
    no random draws inside the loss (draw in `augment`);
  * every reduction over samples honours `inp.weight` (float [B]; None on the sequential path):
    use `raymm.policy.sample_mean`, and keep padding rows out of anything that compares samples
    within the batch (e.g. mask them out of InfoNCE's candidates with `log(weight)`);
  * Python-level structure may depend only on what a bucket shares: `inp.held`, the keys of
    `inp.trainable`/`inp.anchor`, `inp.extras` (the server's broadcast, identical for every
    device) and `inp.round`. Inside the loss, `inp.trainable[name]`, `inp.anchor[name]`,
    `inp.y`, `inp.present` and `inp.out` are one device's unbatched views;
  * `augment(xb, present, held, sensors, gen)` (optional) is called per device and minibatch
    outside vmap with that device's generator, in the sequential path's order, so its draws are
    identical; `device_extras(model, xs, y, held_t, use_adapter)` (optional) is called per
    device after training with the module holding that device's trained parameters.

Starting values are the round's broadcast for travelling groups and each device's own state
for the `local` group, as in `LocalTrainer.train`; a method whose devices start from other
per-device parameters (e.g. cluster models) must extend `VectorisedTrainer._initial` the same way.
A bucket keeps its Python structure fixed; pure torch code is what vmap needs -- use `.detach()`
(or `torch.no_grad()`, which `grad` respects) for stop-gradients such as MCFT's frozen features.

Falls back to the sequential path, with the reason logged (once per host), when the objective
does not declare `vectorisable`, when the model has buffers (e.g. batch norm), or for a bucket
whose lock-step run raises (its devices then train sequentially, so a crashing device is still
recorded as that device's failure).
"""

from __future__ import annotations

import copy
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.func import functional_call, grad_and_value, vmap

from raymm import seeding
from raymm.accounting import device_groups
from raymm.config import TrainingSpec
from raymm.data.base import Dataset
from raymm.host import DeviceHost, HostSpec
from raymm.local import DeviceOutcome, LocalTrainer
from raymm.messages import Broadcast, HostResult, RoundPlan
from raymm.models import LOCAL
from raymm.policy import LossInputs, Objective
from raymm.population import Population

log = logging.getLogger("raymm.vectorised")

Params = dict[str, Tensor]


def why_not_vectorised(objective: Objective, model: torch.nn.Module | None = None) -> str | None:
    """The reason this objective/model cannot train in lock-step, or None when it can."""
    if not getattr(objective, "vectorisable", False):
        return (f"objective {type(objective).__name__} does not declare `vectorisable = True` "
                "(see raymm.vectorised for what that promises)")
    hooks = [h for h in ("device_tensors", "device_finish") if hasattr(objective, h)]
    if hooks:
        return f"objective {type(objective).__name__} uses per-device hooks ({', '.join(hooks)})"
    if model is not None and any(True for _ in model.buffers()):
        return "the model has buffers (e.g. batch norm); only parameter-only models are vmapped"
    return None


# --------------------------------------------------------------------------- optimizers


class FunctionalOptimizer:
    """`torch.optim.SGD` / `Adam` (as `LocalTrainer` builds them) as pure functions of stacked
    parameters: `step(params, grads, state) -> (params, state)`; fresh state per round, as the
    sequential path builds a fresh optimizer per device."""

    def __init__(self, training: TrainingSpec) -> None:
        self.t = training

    def init(self, params: Params) -> dict[str, Any]:
        return {"step": 0, "buf": {}, "m": {}, "v": {}}

    def step(self, params: Params, grads: Params, state: dict[str, Any]
             ) -> tuple[Params, dict[str, Any]]:
        t = self.t
        step = state["step"] + 1
        out: Params = {}
        new = {"step": step, "buf": {}, "m": {}, "v": {}}
        for name, p in params.items():
            g = grads[name]
            if t.weight_decay:
                g = g + t.weight_decay * p
            if t.optimizer == "adam":
                b1, b2, eps = 0.9, 0.999, 1e-8
                m = state["m"].get(name, torch.zeros_like(p)).lerp(g, 1 - b1)
                v = state["v"].get(name, torch.zeros_like(p)) * b2 + (1 - b2) * g * g
                denom = v.sqrt() / math.sqrt(1 - b2 ** step) + eps
                out[name] = p - (t.lr / (1 - b1 ** step)) * m / denom
                new["m"][name], new["v"][name] = m, v
                continue
            if t.momentum:
                buf = g if step == 1 else state["buf"][name] * t.momentum + g
                new["buf"][name] = buf
                g = buf
            out[name] = torch.add(p, g, alpha=-t.lr)  # as torch.optim.SGD's add_(alpha=-lr)
        return out, new


# --------------------------------------------------------------------------- trainer


@dataclass(frozen=True)
class Request:
    """One selected device's work this round, as the host would pass it to `LocalTrainer`."""

    device: int
    indices: np.ndarray
    held: np.ndarray
    groups: tuple[str, ...]
    local: np.ndarray | None


class VectorisedTrainer:
    """Trains buckets of devices in lock-step on the module of a `LocalTrainer` (shared, or a
    copy on the accelerator). Returns `DeviceOutcome`s equal to the sequential path's."""

    def __init__(self, base: LocalTrainer, chunk: int = 512) -> None:
        self.base = base
        self.chunk = chunk
        self.model = base.model
        self.layout = base.layout
        self.sensors = base.dataset.sensors
        self.objective = base.objective
        self.optim = FunctionalOptimizer(base.training)
        self.slot_of = {s.name: (g, s) for g, slots in self.layout.slots.items() for s in slots}
        self.start: Params = {}
        self.received: dict[str, np.ndarray] = {}

    def train(self, requests: list[Request], rnd: int, broadcast: Broadcast
              ) -> dict[int, DeviceOutcome]:
        """Outcomes of every device whose bucket trained; devices of a bucket that raised are
        left out (the caller trains them sequentially) and the error is logged."""
        # the round's starting values, snapshotted: `device_extras` later loads each device's
        # trained values into the shared module
        self.layout.load(self.model, broadcast.params)
        self.start = {n: p.detach().clone() for n, p in self.model.named_parameters()}
        self.received = broadcast.params
        extras = {k: torch.from_numpy(v).to(self.base.device)
                  for k, v in broadcast.extras.items()}
        out: dict[int, DeviceOutcome] = {}
        for bucket in self._buckets(requests):
            for start in range(0, len(bucket), self.chunk):
                chunk = bucket[start:start + self.chunk]
                try:
                    out.update(self._train_chunk(chunk, rnd, extras))
                except Exception as exc:  # noqa: BLE001 - those devices go sequential
                    log.warning("vectorised training of %d device(s) failed (%s: %s); they "
                                "train sequentially", len(chunk), type(exc).__name__, exc)
        return out

    def _buckets(self, requests: list[Request]) -> list[list[Request]]:
        bs = self.base.training.batch_size
        buckets: dict[tuple[Any, ...], list[Request]] = {}
        for r in requests:
            key = (r.held.tobytes(), r.groups, -(-r.indices.shape[0] // bs))
            buckets.setdefault(key, []).append(r)
        return [sorted(b, key=lambda r: r.device) for _, b in sorted(buckets.items())]

    # --- one lock-step program ------------------------------------------------------------
    def _train_chunk(self, reqs: list[Request], rnd: int, extras: dict[str, Tensor]
                     ) -> dict[int, DeviceOutcome]:
        base, t = self.base, self.base.training
        use_adapter = bool(self.objective.uses_adapter and LOCAL in self.layout.slots)
        groups = list(reqs[0].groups)
        names = sorted(set(self.layout.names(groups + ([LOCAL] if use_adapter else []))))
        if not names:
            raise ValueError("no trainable parameters")
        frozen = {n: p for n, p in self.start.items() if n not in names}
        params = self._initial(reqs, names, self.start, use_adapter)
        anchor = dict(params)
        held = reqs[0].held
        held_names = tuple(m for m, h in zip(self.sensors, held) if h)
        held_t = torch.from_numpy(held.astype(np.float32)).to(base.device)
        gens = [seeding.torch_generator(base.seed, rnd, r.device, "batches") for r in reqs]
        sizes = np.array([r.indices.shape[0] for r in reqs])
        steps = -(-int(sizes[0]) // t.batch_size)
        weight = self._weights(sizes, steps)             # [G, steps, B]: 1 real, 0 padding
        augment = getattr(self.objective, "augment", None)
        model, objective = self.model, self.objective

        def loss_fn(train: Params, anc: Params, xb: dict[str, Tensor], y: Tensor,
                    present: Tensor, w: Tensor) -> Tensor:
            out = functional_call(model, {**frozen, **train}, (xb, present),
                                  {"use_adapter": use_adapter})
            return objective.loss(LossInputs(out, y, present, held_names, train, anc, extras,
                                             rnd, groups=tuple(groups), weight=w))

        step_fn = vmap(grad_and_value(loss_fn))
        state = self.optim.init(params)
        losses = []
        for _ in range(t.local_epochs):
            rows = self._epoch_rows(reqs, gens, sizes, steps)  # [G, steps, B] rows of the split
            for s in range(steps):
                xb, present = self._inputs(rows[:, s], held, held_t)
                y = base.train_y.index_select(0, rows[:, s].reshape(-1)).view(len(reqs), -1)
                if augment is not None:
                    xb, present = self._augment(augment, xb, present, weight[:, s], held_names,
                                                gens)
                grads, loss = step_fn(params, anchor, xb, y, present, weight[:, s])
                params, state = self.optim.step(params, grads, state)
                losses.append(loss.detach())
        return self._outcomes(reqs, groups, params, torch.stack(losses, 1), use_adapter)

    def _initial(self, reqs: list[Request], names: list[str], live: dict[str, Tensor],
                 use_adapter: bool) -> Params:
        """Stacked starting values: the broadcast for travelling groups (a zero-copy expand),
        each device's own adapter for the local group."""
        g = len(reqs)
        out: Params = {}
        if use_adapter:
            init = self.base.initial_local
            local = torch.from_numpy(np.stack([r.local if r.local is not None else init
                                               for r in reqs]).astype(np.float32))
        for n in names:
            group, slot = self.slot_of[n]
            if group == LOCAL:
                out[n] = local[:, slot.start:slot.stop].reshape((g,) + slot.shape).to(
                    self.base.device)
            else:
                p = live[n]
                out[n] = p.unsqueeze(0).expand((g,) + tuple(p.shape))
        return out

    def _epoch_rows(self, reqs: list[Request], gens: list[torch.Generator],
                    sizes: np.ndarray, steps: int) -> Tensor:
        """One epoch's minibatch rows of every device, drawn from its own
        `(seed, round, device, "batches")` generator exactly as the sequential path draws them
        (per epoch, after the previous epoch's augmentation draws), padded to the batch size."""
        bs = self.base.training.batch_size
        rows = np.zeros((len(reqs), steps * bs), dtype=np.int64)
        for i, (r, gen) in enumerate(zip(reqs, gens)):
            n = int(sizes[i])
            rows[i, :n] = r.indices[torch.randperm(n, generator=gen).numpy()]
        return torch.from_numpy(rows.reshape(len(reqs), steps, bs)).to(self.base.device)

    def _weights(self, sizes: np.ndarray, steps: int) -> Tensor:
        bs = self.base.training.batch_size
        real = (np.arange(steps * bs)[None, :] < sizes[:, None]).astype(np.float32)
        return torch.from_numpy(real.reshape(len(sizes), steps, bs)).to(self.base.device)

    def _inputs(self, rows: Tensor, held: np.ndarray, held_t: Tensor
                ) -> tuple[dict[str, Tensor], Tensor]:
        base = self.base
        g, b = rows.shape
        flat = rows.reshape(-1)
        xb = {m: base.train_x[m].index_select(0, flat).view((g, b) + base.dataset.sensor_shape(m))
              if h else
              torch.zeros(base.dataset.sensor_shape(m), device=base.device).expand(
                  (g, b) + base.dataset.sensor_shape(m))
              for m, h in zip(self.sensors, held)}
        return xb, held_t.expand(g, b, -1)

    def _augment(self, augment: Callable[..., Any], xb: dict[str, Tensor], present: Tensor,
                 weight: Tensor, held_names: tuple[str, ...], gens: list[torch.Generator]
                 ) -> tuple[dict[str, Tensor], Tensor]:
        """The objective's augmentation, device by device with each device's own generator, on
        the real rows only (as the sequential path calls it), padding re-attached after."""
        real = weight.sum(1).to(torch.int64).tolist()
        xs: dict[str, list[Tensor]] = {m: [] for m in xb}
        ps = []
        for i, gen in enumerate(gens):
            n = real[i]
            xa, pa = augment({m: x[i, :n] for m, x in xb.items()}, present[i, :n], held_names,
                             self.sensors, gen)
            for m in xb:
                xs[m].append(torch.cat([xa[m], xb[m][i, n:]]))
            ps.append(torch.cat([pa, present[i, n:]]))
        return {m: torch.stack(v) for m, v in xs.items()}, torch.stack(ps)

    def _outcomes(self, reqs: list[Request], groups: list[str], params: Params,
                  losses: Tensor, use_adapter: bool) -> dict[int, DeviceOutcome]:
        g = len(reqs)
        flat = {grp: torch.cat([params[s.name].detach().reshape(g, -1)
                                for s in self.layout.slots[grp]], 1).cpu().numpy()
                for grp in groups + ([LOCAL] if use_adapter else [])}
        mean_loss = losses.double().mean(1).cpu().numpy()
        report = getattr(self.objective, "device_extras", None)
        out = {}
        for i, r in enumerate(reqs):
            updates = {grp: flat[grp][i] for grp in groups}
            local = flat[LOCAL][i].copy() if use_adapter else r.local
            extras = self._device_extras(report, r, updates, local, use_adapter) \
                if report is not None else {}
            out[r.device] = DeviceOutcome(updates, local, float(mean_loss[i]), extras)
        return out

    def _device_extras(self, report: Callable[..., Any], r: Request,
                       updates: dict[str, np.ndarray], local: np.ndarray | None,
                       use_adapter: bool) -> dict[str, np.ndarray]:
        """The module as the sequential path leaves it after training this device: the
        round's values, the device's trained groups and its adapter."""
        base = self.base
        self.layout.load(self.model, self.received)
        self.layout.load(self.model, updates)
        if use_adapter and local is not None:
            self.layout.load(self.model, {LOCAL: local})
        idx = torch.from_numpy(r.indices.astype(np.int64))
        held_t = torch.from_numpy(r.held.astype(np.float32)).to(base.device)
        return dict(report(self.model, base.inputs(idx, r.held), base.train_y[idx], held_t,
                           use_adapter))


# --------------------------------------------------------------------------- host


class _PrecomputedTrainer:
    """Stands in for a host's `LocalTrainer`: hands out the outcomes trained in lock-step this
    round and trains anything else with the sequential trainer. An outcome is used only if it was
    computed for exactly the round and groups the host asks for, so the host's own bookkeeping
    (failures, device-local state, stacking) stays the single source of truth."""

    def __init__(self, base: LocalTrainer) -> None:
        self.base = base
        self.ready: dict[int, tuple[tuple[int, tuple[str, ...]], DeviceOutcome]] = {}

    def __getattr__(self, name: str) -> Any:
        if name == "base":  # not set yet (e.g. while unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.base, name)

    def train(self, device: int, rnd: int, indices: np.ndarray, held: np.ndarray,
              groups: list[str], broadcast: Broadcast, local: np.ndarray | None,
              start: dict[str, np.ndarray] | None = None,
              state: dict[str, np.ndarray] | None = None) -> DeviceOutcome:
        hit = self.ready.pop(device, None)
        if hit is not None and hit[0] == (rnd, tuple(groups)):
            return hit[1]
        return self.base.train(device, rnd, indices, held, groups, broadcast, local, start,
                               state)


class VectorisedHost(DeviceHost):
    """A `DeviceHost` whose selected devices train in lock-step (see the module docstring)."""

    def __init__(self, device_ids: np.ndarray, population: Population, dataset: Dataset,
                 spec: HostSpec, device: str = "cpu") -> None:
        super().__init__(device_ids, population, dataset, spec, device)
        base = self.trainer
        self.reason = why_not_vectorised(spec.objective, base.model)
        if self.reason is None and spec.training.exchange != "params":
            self.reason = (f"training.exchange={spec.training.exchange!r} keeps per-device "
                           "parameters between rounds")
        self.vec = None
        if self.reason is not None:
            log.warning("training sequentially: %s", self.reason)
            return
        self.vec = VectorisedTrainer(base, spec.training.vectorise_chunk)
        self.trainer = _PrecomputedTrainer(base)  # type: ignore[assignment]

    def train(self, plan: RoundPlan, broadcast: Broadcast) -> HostResult:
        if self.vec is None or broadcast.clusters is not None:  # per-device cluster models
            return super().train(plan, broadcast)
        mine = plan.selected[np.isin(plan.selected, self.ids)]
        sensors, upload = self.pop.sensors, self.spec.training.upload
        requests = []
        for dev in mine.tolist():
            held = self.pop.sensor_mask[dev]
            groups = tuple(device_groups(held, sensors, plan.active_groups, upload))
            requests.append(Request(dev, self.pop.indices(dev), held, groups,
                                    self.local_state.get(dev)))
        done = self.vec.train(requests, plan.round, broadcast)
        pre: _PrecomputedTrainer = self.trainer  # type: ignore[assignment]
        pre.ready = {r.device: ((plan.round, r.groups), done[r.device])
                     for r in requests if r.device in done}
        try:
            return super().train(plan, broadcast)
        finally:
            pre.ready = {}


def make_host(device_ids: np.ndarray, population: Population, dataset: Dataset,
              spec: HostSpec, device: str = "cpu") -> DeviceHost:
    """The host an executor should build: lock-step when the scenario asks for it."""
    cls = VectorisedHost if spec.training.vectorise else DeviceHost
    return cls(device_ids, population, dataset, spec, device)
