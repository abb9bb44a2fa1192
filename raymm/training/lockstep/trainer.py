"""Lock-step local training of many devices at once with `torch.func` (the fast path).

`raymm.training.sequential.SequentialTrainer` trains one device after another and stays the
reference.
Here a host trains its selected devices together: devices are grouped into *buckets* that share
everything that is Python-level structure -- the sensor set (hence the held sensors, the groups
trained and which inputs are all-zero) -- and each bucket runs as one program. Trainable parameters
are stacked along a leading device axis and the bucket runs the very local update the sequential
path runs (`raymm.training.local_update`: the same loss, minibatch loop and optimizer), the loss
vmapped over the devices and differentiated by one reverse pass of their sum.

Devices of a bucket may take different numbers of steps per epoch. A bucket is ordered by steps
per epoch, most first, so the devices that have a minibatch in step s of an epoch are a prefix
of it: step s runs on that prefix only, and the devices after it are set aside as they are
(parameters, optimizer state, gradient sums) until the next epoch or the end -- a device takes
exactly its own steps and no others, so nothing is computed for devices without a minibatch,
and a bucket's step count is that of its longest device rather than one program per distinct
step count. Under Adam a device set aside rejoins having skipped steps: its bias correction
follows its own step count (`raymm.training._kernels.lockstep_adam`). The last minibatch of an
epoch is shorter for some devices than for others: it is padded to the batch size, and
`LossInputs.weight` marks real rows 1 and padding 0. An objective that declares
`mixes_sensor_sets` lets devices of every sensor set share a bucket: a sensor a device lacks is
its all-zero input, its presence mask says so, and the gradient of a group it does not train is
dropped (`LockstepTrainer._keeps`); such a device runs the encoder of a sensor it lacks once, on
one zero sample, rather than on every minibatch (`raymm.training.lockstep.encoders`).
Minibatch order, augmentation draws and everything else random come from the same per-device
streams as the sequential path.

Agreement with the sequential path: the same updates up to float32 rounding (batched matmuls
and weighted means sum in a different order); `tests/unit/training/lockstep/test_trainer.py`
says how close, on every parameter after several rounds. A device's result does not depend on
which other devices share its bucket or chunk, so packing still does not change results.

An objective opts in with `vectorisable = True`, which promises the lock-step contract written
in `raymm.training.local_update`. Its hooks run as on the sequential path: `augment(xb, present,
held,
sensors, gen)` per device and minibatch outside vmap with that device's generator, in the
sequential path's order, so its draws are identical; `device_extras(model, xs, y, held_t,
use_adapter)` per device after training with the module holding that device's trained
parameters (one left at its default is not called here).

Starting values are per device, exactly what the sequential path loads: the vectors
`raymm.protocol.exchange.start_vectors` gives the device (the broadcast, its cluster's model, or the
parameters it kept under `training.exchange: delta|none`) and its own adapter for the `local`
group. Every parameter the forward uses is stacked per device -- trained ones as the vmapped
trainable parameters, frozen ones (e.g. MCFT's earlier-modality branches) as vmapped inputs
without gradient -- unless every device of the chunk starts from the very same vector, which
then stays one shared tensor. An encoder no device of the program trains (a frozen branch) sees
each sample once a round, not once an epoch: its embeddings are computed before the steps, in
calls of the steps' own shapes, and each step takes its rows of them
(`frozen_cache.FrozenEncoders`; the same bits), and a device whose frozen weights have
not changed since an earlier round reuses that round's (`raymm.training.lockstep.frozen_cache`). The
objective's per-device hooks run as on the sequential path: `device_tensors(state, extras,
layout, groups)` per device, stacked into `LossInputs.local` (one device's view inside the
loss); `device_finish` per device after training with its start and end vectors (and its mean
gradients when `needs_grad_mean`).
`Dataset.augment` runs per device on the real rows with the device's own `(seed, round, device,
"data_augment")` stream.
A bucket keeps its Python structure fixed; pure torch code is what vmap needs -- use `.detach()`
(or `torch.no_grad()`) for stop-gradients such as MCFT's frozen features.

Falls back to the sequential path, with the reason logged (once per host), when the objective
does not declare `vectorisable`, when the model has buffers (e.g. batch norm), or for a bucket
whose lock-step run raises (e.g. `device_tensors` of different shapes across devices) (its
devices then train sequentially, so a crashing device is still recorded as that device's
failure). The latter is a fallback: the trainer counts its devices by reason each round
(`LockstepTrainer.fallbacks`), the host's result carries them
(`HostResult.lockstep_fallbacks`) and the round's row sums them (`lockstep_fallbacks`), so a
fast path that fails is seen, not just slower. Under `RAYMM_STRICT_LOCKSTEP=1` (`strict`: the
tests and the reference runs) the trainer raises instead (`LockstepFallback`), and so does the
round loop on a round whose row counts any (`raymm.sim.engine.run_round`: for a Ray worker
started without the variable).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
import torch
from torch import Tensor

from raymm import seeding
from raymm.models import LOCAL
from raymm.phases import phase
from raymm.protocol.fast_paths import ClosedFormLoss, closed_form_for
from raymm.protocol.messages import Broadcast
from raymm.protocol.seams import DeviceFinish, Objective
from raymm.training._kernels.lockstep_adam import LockstepAdam
from raymm.training._kernels.lockstep_conv import blocked_convolutions
from raymm.training.local_update import (
    Batch,
    FunctionalOptimizer,
    GradFn,
    LocalUpdate,
    Params,
    StepperFactory,
    UpdateResult,
)
from raymm.training.lockstep.batches import Minibatches
from raymm.training.lockstep.closed_form import closed_form_grads
from raymm.training.lockstep.encoders import SensorEncoders
from raymm.training.lockstep.fallback import fallback_error, strict
from raymm.training.lockstep.frozen_cache import FrozenEncoders
from raymm.training.lockstep.gradients import vmap_autograd
from raymm.training.lockstep.program import ChunkRun, Feed, Program, Request
from raymm.training.sequential import DeviceOutcome, SequentialTrainer

log = logging.getLogger("raymm.training.lockstep")


def _lockstep_adam(params: Params, opt: FunctionalOptimizer, grad_sum: bool,
                  proximal: tuple[float, tuple[str, ...]]) -> LockstepAdam:
    return LockstepAdam(params, opt.lr, opt.BETAS, opt.EPS, opt.weight_decay, grad_sum, proximal)


#: the optimizers that step a program's stacks themselves, by `training.optimizer`
STEPPERS: dict[str, StepperFactory] = {"adam": _lockstep_adam}

# --------------------------------------------------------------------------- trainer


class LockstepTrainer:
    """Trains buckets of devices in lock-step on the module of a `SequentialTrainer` (shared, or a
    copy on the accelerator): `run` gives the trained rows, `outcomes` the `DeviceOutcome`s
    the sequential path would give."""

    def __init__(self, base: SequentialTrainer, chunk: int = 1024,
                 closed_form: bool = True) -> None:
        self.base = base
        self.chunk = chunk
        #: `execution.training.closed_form`: hand-written gradients where a model and loss allow
        self.closed_form = closed_form
        self.model = base.model
        self.layout = base.layout
        self.sensors = base.dataset.sensors
        self.objective = base.objective
        self.slot_of = {s.name: (g, s) for g, slots in self.layout.slots.items() for s in slots}
        #: per sensor, its encoder's parameter names
        self.encoder_params = {m: [n for n in self.slot_of if n.startswith(f"encoders.{m}.")]
                               for m in self.sensors}
        #: devices train (and hand out) their own adapter, the `local` group
        self.use_adapter = bool(self.objective.uses_adapter and LOCAL in self.layout.slots)
        self.fallback: dict[str, np.ndarray] = {}
        #: this round's programs that raised, their devices trained sequentially instead:
        #: reason ("Type: message") -> devices
        self.fallbacks: dict[str, int] = {}
        self.received: dict[str, np.ndarray] = {}
        self.bcast_extras: dict[str, np.ndarray] = {}
        self.upload = True
        self.active: tuple[str, ...] = ()
        #: minibatch orders, rows and inputs, drawn as the sequential path draws them
        self.data = Minibatches(base)
        #: frozen encoders' embeddings: once a round, kept across rounds
        self.frozen = FrozenEncoders(base, self.data, self.encoder_params)

    @phase("lockstep.program")
    def run(self, requests: list[Request], rnd: int, broadcast: Broadcast,
            upload: bool = True, active: tuple[str, ...] = ()) -> list[ChunkRun]:
        """One `ChunkRun` per lock-step program that ran; devices of a bucket that raised are
        left out (the caller trains them sequentially), the error is logged and counted in
        `fallbacks` (under `strict`: raised as `LockstepFallback`). `active`: the
        round's active groups, what a program that mixes sensor sets trains (see
        `_train_chunk`)."""
        self.base.start_round(rnd)
        # values for groups a device's start vectors do not name: the round's broadcast, else
        # the module's current ones (as the sequential path leaves them in the module)
        self.layout.load(self.model, broadcast.params)
        self.fallback = self.layout.flatten(self.model, list(self.layout.slots))
        self.received = broadcast.params
        self.bcast_extras = broadcast.extras
        self.upload = upload   # whether this round's extras reach the server (DeviceFinish)
        self.active = active
        extras = {k: torch.from_numpy(v).to(self.base.accelerator)
                  for k, v in broadcast.extras.items()}
        runs: list[ChunkRun] = []
        self.fallbacks = {}
        for bucket in self._buckets(requests):
            for start in range(0, len(bucket), self.chunk):
                chunk = bucket[start:start + self.chunk]
                try:
                    runs.append(self._train_chunk(chunk, rnd, extras))
                except Exception as exc:  # noqa: BLE001 - those devices go sequential
                    log.warning("lock-step training of %d device(s) failed (%s: %s); they "
                                "train sequentially", len(chunk), type(exc).__name__, exc)
                    why = f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"
                    self.fallbacks[why] = self.fallbacks.get(why, 0) + len(chunk)
                    if strict():
                        raise fallback_error(f"round {rnd}", {why: len(chunk)}) from exc
        return runs

    def outcomes(self, runs: list[ChunkRun], rnd: int) -> dict[int, DeviceOutcome]:
        """Every trained device's `DeviceOutcome`, the objective's per-device hooks run."""
        return {d: o for run in runs for d, o in self._outcomes(run, rnd).items()}

    def _buckets(self, requests: list[Request]) -> list[list[Request]]:
        """Devices that share held sensors and trained groups, most steps per epoch first
        (then by id). An objective that declares `mixes_sensor_sets` lets devices of every
        sensor set share one bucket; devices that train other groups share it too unless
        weight decay would move a parameter a device does not train (see `_train_chunk`). A
        device without samples is left out (the sequential path trains it)."""
        t = self.base.training
        mixed = self.objective.mixes_sensor_sets
        buckets: dict[tuple[Any, ...], list[tuple[int, int, Request]]] = {}
        for r in requests:
            steps = -(-r.indices.shape[0] // t.batch_size)
            if steps:
                key = ((r.groups,) if t.weight_decay else ()) if mixed else \
                    (r.held.tobytes(), r.groups)
                buckets.setdefault(key, []).append((-steps, r.device, r))
        return [[r for *_, r in sorted(b, key=lambda e: e[:2])]
                for _, b in sorted(buckets.items())]

    # --- one lock-step program ------------------------------------------------------------
    def _train_chunk(self, reqs: list[Request], rnd: int, extras: dict[str, Tensor]
                     ) -> ChunkRun:
        """One lock-step program: plan it, fix how its minibatches are drawn, pick its
        gradient once, run the one local update over its batches, and hand back every
        device's rows."""
        prog = self._plan(reqs, rnd, extras)
        feed = self._feed(prog)
        update = LocalUpdate(self.base.call, self.objective, self.base.training,
                             use_adapter=self.use_adapter, held=prog.held_names,
                             extras=extras, round=rnd, groups=tuple(prog.groups),
                             unread=prog.unread, steppers=STEPPERS)
        grads_of = self._gradient(prog, feed, update)
        with blocked_convolutions():   # a device's bits whatever its program's size
            done = update.run(prog.params, self._batches(prog, feed), grads_of,
                              grad_sum=self.objective.needs_grad_mean)
        return self._finish(prog, done)

    def _plan(self, reqs: list[Request], rnd: int, extras: dict[str, Tensor]) -> Program:
        """What the program trains and from where: its groups and parameters, every device's
        starting values, held sensors, dropped gradients and steps per epoch."""
        t = self.base.training
        groups, names = self._trained(reqs)
        sources = [self._sources(r) for r in reqs]
        params, shared, dev_frozen = self._initial(sources, names)
        anchor = dict(params)
        local_t = self._device_tensors(reqs)
        helds = np.stack([r.held for r in reqs])               # [G, M]
        per_held = [tuple(m for m, h in zip(self.sensors, held) if h) for held in helds]
        held_names = tuple(m for j, m in enumerate(self.sensors) if helds[:, j].any())
        held_t = torch.from_numpy(helds.astype(np.float32)).to(self.base.accelerator)
        keeps = self._keeps(reqs, names)
        sizes = np.array([r.indices.shape[0] for r in reqs])
        own_steps = -(-sizes // t.batch_size)            # per epoch; most first (`_buckets`)
        steps = int(own_steps[0])
        # how many devices (a prefix) have a minibatch in each step of an epoch
        training = (own_steps[None, :] > np.arange(steps)[:, None]).sum(1).tolist()
        # encoders the loss reads nothing from this round: not run (zero embeddings)
        unread = self.base.unread(tuple(groups), held_names, extras)
        return Program(reqs, rnd, groups, names, sources, params, anchor, shared, dev_frozen,
                        local_t, helds, per_held, held_t, held_names, keeps, sizes, own_steps,
                        training, unread)

    def _trained(self, reqs: list[Request]) -> tuple[list[str], list[str]]:
        """(groups, parameter names) a program trains: every group any device of the chunk
        trains; in a program that mixes sensor sets, every group active this round. Which
        parameters are trained (stacked per device) and which stay shared must not depend on
        which devices share the program (a shared weight is another kernel, hence other
        bits, than a stacked one)."""
        trained = {g for r in reqs for g in r.groups}
        if self.objective.mixes_sensor_sets:
            trained |= set(self.active) - {LOCAL}
        groups = [g for g in self.layout.slots if g in trained]
        names = sorted(set(self.layout.names(groups + ([LOCAL] if self.use_adapter else []))))
        if not names:
            raise ValueError("no trainable parameters")
        return groups, names

    def _feed(self, p: Program) -> Feed:
        """How the program's minibatches are drawn, from each device's own streams as the
        sequential path draws them. When nothing but the minibatch order draws from them,
        every epoch's order is drawn now, and a frozen encoder's embeddings can be computed
        once a round (inputs as stored); else each epoch draws its order as it comes."""
        base = self.base
        devices = np.array([r.device for r in p.reqs], np.int64)
        seeds = seeding.torch_seeds(base.seed, p.rnd, devices, "batches")
        data_aug = base.dataset.augment
        aug_gens = (seeding.generators(seeding.torch_seeds(base.seed, p.rnd, devices,
                                                           "data_augment"))
                    if data_aug is not None else [])
        weight = self.data.weights(p.sizes, p.steps)             # [G, steps, B]: 1 real, 0 padding
        # a default `augment` draws nothing: the minibatch order may then be drawn at once
        augment = self.objective.augment if self.objective.overrides(Objective.augment) \
            else None
        f = Feed(weight, augment, data_aug, aug_gens)
        if augment is None and data_aug is None:
            # draw every epoch's order now, in the sequential path's order, with one re-seeded
            # generator
            perms = self.data.all_epoch_perms(seeds, p.sizes, p.steps)
            f.all_rows = [self.data.rows_of(p.indices, q, p.steps) for q in perms]
            f.frozen = [m for m in self.frozen.sensors(p.names, p.helds) if m not in p.unread]
            skipped = set(p.unread)   # nothing reads their inputs either
            # the samples' positions where the embeddings are (`rows_of` reads `perms` on CPU)
            f.positions = [q.to(base.accelerator) for q in perms] if f.frozen else []
        else:
            f.gens, skipped = seeding.generators(seeds), set()
        f.gathered = [m for m in self.sensors if m not in f.frozen and m not in skipped]
        return f

    def _batches(self, p: Program, f: Feed) -> Iterator[Batch]:
        """The program's minibatches, epoch by epoch and step by step, each for the prefix of
        devices that have one (run inside the program's convolution context, as the steps'
        own encoders run)."""
        bs = self.base.training.batch_size
        cached = self.frozen.embeddings(f.frozen, p)
        for epoch in range(self.base.training.local_epochs):
            # [G, steps, B] rows of the split
            rows = f.all_rows[epoch] if not f.gens else \
                self.data.epoch_rows(p.indices, f.gens, p.sizes, p.steps)
            for s, k in enumerate(p.training):
                batch = self._minibatch(p, f, rows[:k, s], s, k)
                if cached:   # each sample's frozen embedding, by its local position
                    at = f.positions[epoch][:k, s * bs:(s + 1) * bs]
                    batch = batch._replace(embeddings={
                        m: c[:k].gather(1, at[:, :, None].expand(-1, -1, c.shape[2]))
                        for m, c in cached.items()})
                yield batch

    def _minibatch(self, p: Program, f: Feed, rows: Tensor, s: int, k: int) -> Batch:
        """Step s's minibatch of the first k devices (`rows` [k, B]), augmented as the
        sequential path augments it."""
        xb, present = self.data.inputs(rows, p.helds[:k], p.held_t[:k], f.gathered)
        y = self.base.train_y.index_select(0, rows.reshape(-1)).view(k, -1)
        if f.augment is not None or f.data_aug is not None:
            xb, present = self.data.augment(f.augment, f.data_aug, xb, present, f.weight[:k, s],
                                        p.per_held[:k], f.gens[:k], f.aug_gens[:k])
        return Batch(xb, y, present, f.weight[:k, s], None)

    def _gradient(self, p: Program, f: Feed, update: LocalUpdate) -> GradFn:
        """The program's gradient, picked once: a model and loss known in closed form skip
        autograd (`raymm.training.lockstep.closed_form`); else `gradients.vmap_autograd`, with
        the objective's loss after the encoders in closed form where one is registered
        (`raymm.protocol.fast_paths`), else the loss under vmap and autograd (the encoders
        `LockstepEncoder` knows outside it)."""
        keeps = p.keeps
        encoders = self._encoder_plan(p.helds, p.names, keeps)
        if encoders is not None:   # masks the plan makes redundant
            keeps = {n: keep for n, keep in keeps.items() if n not in encoders.unmasked}
        plain = self.closed_form and not (
            p.local_t or keeps or encoders or p.unread or f.frozen or self.use_adapter)
        return closed_form_grads(self.model, self.objective, p.params, p.anchor,
                                 proximal=update.proximal_in_loss(p.names), plain=plain) \
            or vmap_autograd(update, self.base.call, p.anchor, p.shared, p.dev_frozen,
                            p.local_t, keeps, encoders,
                            self._closed_loss(p.names, f.frozen, p.unread, p.local_t),
                            self.encoder_params)

    def _finish(self, p: Program, done: UpdateResult) -> ChunkRun:
        """The trained program as rows: each device's losses of its own steps, then zeros."""
        losses = torch.zeros((len(p.reqs), len(done.losses)), dtype=torch.float64,
                             device=self.base.accelerator)
        for i, loss in enumerate(done.losses):   # a device's own steps; zeros after them
            losses[:len(loss), i] = loss
        return self._rows(p.reqs, p.sources, p.groups, done.params, losses,
                          p.own_steps * self.base.training.local_epochs, done.grad_sum)

    def _closed_loss(self, names: list[str], frozen: list[str], unread: Mapping[str, int],
                     local_t: Params) -> ClosedFormLoss | None:
        """The objective's loss after the encoders in closed form, where one is registered for
        it (`raymm.protocol.fast_paths`) that covers this program: every encoder it runs
        trained, no device tensors."""
        if not self.closed_form or local_t or not self.model.takes_embeddings:
            return None
        run = [m for m in self.sensors if m not in frozen and m not in unread]
        if not all(set(self.encoder_params[m]) <= set(names) for m in run):
            return None
        fast = closed_form_for(self.objective)
        if fast is None or fast.after_encoders is None:
            return None
        return fast.after_encoders(self.objective, self.model, names, self.use_adapter)

    def _sources(self, r: Request) -> dict[str, np.ndarray]:
        """Every group's flat starting vector for one device, as `SequentialTrainer.train` loads
        them: its start vectors (default the broadcast), then its adapter."""
        start = self.received if r.start is None else r.start
        src = {g: start[g] if g in start else
               self.received[g] if g in self.received else self.fallback[g]
               for g in self.layout.slots}
        if self.use_adapter:
            src[LOCAL] = self.base.adapter_start(r.local)
        return src

    def _initial(self, sources: list[dict[str, np.ndarray]], names: list[str]
                 ) -> tuple[Params, Params, Params]:
        """(trainable [G, ...], shared frozen, per-device frozen [G, ...]) starting values. A
        group whose vector is the same object for every device (the broadcast, the initial
        model) is one tensor (expanded, zero-copy, where trained); others are stacked."""
        g, dev = len(sources), self.base.accelerator
        flat: dict[str, tuple[Tensor, bool]] = {}
        for grp in self.layout.slots:
            vs = [s[grp] for s in sources]
            if all(v is vs[0] for v in vs):
                flat[grp] = (torch.tensor(np.asarray(vs[0]), dtype=torch.float32, device=dev),
                             False)
            else:
                flat[grp] = (torch.from_numpy(np.stack(vs).astype(np.float32)).to(dev), True)
        train, shared, frozen = {}, {}, {}
        wanted = set(names)
        for n, (grp, slot) in self.slot_of.items():
            v, per = flat[grp]
            if per:
                p = v[:, slot.start:slot.stop].reshape((g,) + tuple(slot.shape))
            else:
                p = v[slot.start:slot.stop].reshape(tuple(slot.shape))
            if n in wanted:
                # row-major whatever layout its gradient takes: the layout of an operand picks
                # the BLAS kernel, and the gradient's layout depends on the chunk size, so a
                # parameter following it would give a device other bits in another chunk
                train[n] = p if per else p.unsqueeze(0).expand((g,) + tuple(p.shape))
            elif per:
                frozen[n] = p
            else:
                shared[n] = p
        return {n: train[n] for n in names}, shared, frozen

    def _keeps(self, reqs: list[Request], names: list[str]) -> dict[str, Tensor]:
        """In a bucket that mixes trained groups: per parameter some device does not train,
        bool [G] (True: the device trains it). That device's gradient of it is dropped, so
        its optimizer leaves it exactly as it was (no weight decay in such a bucket:
        `_buckets`), as the sequential path leaves a group it does not train."""
        out = {}
        for n in names:
            grp = self.slot_of[n][0]
            if grp == LOCAL:
                continue
            mask = np.array([grp in r.groups for r in reqs])
            if not mask.all():
                out[n] = torch.from_numpy(mask).to(self.base.accelerator)
        return out

    def _encoder_plan(self, helds: np.ndarray, names: list[str], keeps: dict[str, Tensor]
                      ) -> SensorEncoders | None:
        """The sensors whose encoder only some devices of the program run on their data; None
        when every device runs every encoder (or the model cannot take embeddings)."""
        if not self.model.takes_embeddings:
            return None
        plan = SensorEncoders(self.base.call, self.model, self.sensors, helds, names, keeps,
                              self.base.accelerator)
        return plan if plan.plan else None

    def _device_tensors(self, reqs: list[Request]) -> Params:
        """The objective's `device_tensors` of every device (its own state), stacked."""
        if not self.objective.overrides(Objective.device_tensors):
            return {}
        prepare = self.objective.device_tensors
        per = [prepare(r.state or {}, self.bcast_extras, self.layout, list(r.groups))
               for r in reqs]
        keys = set(per[0])
        if any(set(p) != keys for p in per):
            raise ValueError("device_tensors returned different keys for devices of one bucket")
        return {k: torch.stack([torch.as_tensor(p[k]) for p in per]).to(self.base.accelerator)
                for k in sorted(keys)}

    @phase("lockstep.rows")
    def _rows(self, reqs: list[Request], sources: list[dict[str, np.ndarray]],
              groups: list[str], params: Params, losses: Tensor, steps: np.ndarray,
              grad_sum: Params | None) -> ChunkRun:
        """`losses` [G, steps of the longest]: each device's minibatch losses, then zeros;
        `steps`: the optimizer steps each device took."""
        g = len(reqs)
        flat = {grp: self._stacked(params, grp, g).cpu().numpy()
                for grp in groups + ([LOCAL] if self.use_adapter else [])}
        steps_t = torch.from_numpy(steps).to(losses.device)
        mean_grads = ({grp: (self._stacked(grad_sum, grp, g) / steps_t[:, None].float()
                             ).cpu().numpy().astype(np.float32)
                       for grp in groups}
                      if grad_sum is not None else None)
        mean_loss = (losses.sum(1) / steps_t).cpu().numpy()
        return ChunkRun(reqs, sources, groups, flat, mean_loss, steps, mean_grads)

    def _outcomes(self, run: ChunkRun, rnd: int) -> dict[int, DeviceOutcome]:
        objective = self.objective
        reqs, sources, steps = run.reqs, run.sources, run.steps
        use_adapter, mean_grads = self.use_adapter, run.mean_grads
        # the defaults report and keep nothing: skip reloading the module and copying vectors
        report = objective.device_extras if objective.overrides(Objective.device_extras) \
            else None
        finishes = objective.overrides(Objective.device_finish)
        out = {}
        # row views taken in one pass per group (iterating an array), not indexed per device
        rows = {grp: list(v) for grp, v in run.flat.items()}
        loss_of = run.loss.tolist()
        for i, r in enumerate(reqs):
            updates = {grp: rows[grp][i] for grp in r.groups}
            local = rows[LOCAL][i].copy() if use_adapter else r.local
            extras = self._device_extras(report, r, sources[i], updates, local) \
                if report is not None else {}
            new_state: dict[str, np.ndarray] = {}
            if finishes:
                before = {grp: np.array(sources[i][grp], dtype=np.float32)
                          for grp in r.groups}
                new_state, sent = objective.device_finish(DeviceFinish(
                    r.device, rnd, r.groups, before, updates, r.state or {},
                    dict(self.bcast_extras), int(steps[i]), self.base.training.lr,
                    {grp: mean_grads[grp][i] for grp in r.groups} if mean_grads else {},
                    self.upload))
                extras = {**extras, **sent}
            out[r.device] = DeviceOutcome(updates, local, loss_of[i], extras, new_state)
        return out

    def _stacked(self, values: Params, grp: str, g: int) -> Tensor:
        """[G, P]: every device's flat vector of group `grp` from its per-parameter stacks,
        each copied once, straight into its columns (one laid out transposed per device cannot
        be viewed flat, so a reshape-then-cat would copy it twice). A parameter `values` lacks
        (one the loss did not use has no gradient sum) is zeros, as on the sequential path."""
        slots = self.layout.slots[grp]
        new = torch.empty if all(s.name in values for s in slots) else torch.zeros
        out = new((g, self.layout.sizes[grp]), dtype=torch.float32, device=self.base.accelerator)
        for s in slots:
            if s.name in values:
                out[:, s.start:s.stop].view((g,) + tuple(s.shape)).copy_(values[s.name].detach())
        return out

    def _device_extras(self, report: Callable[..., Any], r: Request,
                       source: dict[str, np.ndarray], updates: dict[str, np.ndarray],
                       local: np.ndarray | None) -> dict[str, np.ndarray]:
        """The module as the sequential path leaves it after training this device: its
        starting values, its trained groups and its adapter."""
        base = self.base
        own = {**updates, **({LOCAL: local} if self.use_adapter and local is not None else {})}
        # the starting values of the groups it did not train, and what it trained
        self.layout.load(self.model, {**source, **own})
        idx = torch.from_numpy(r.indices.astype(np.int64))
        held_t = torch.from_numpy(r.held.astype(np.float32)).to(base.accelerator)
        return dict(report(self.model, base.inputs(idx, r.held), base.train_y[idx], held_t,
                           self.use_adapter))
