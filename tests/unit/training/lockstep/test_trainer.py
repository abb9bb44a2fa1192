"""Lock-step (torch.func) local training agrees with the sequential reference path.

Tolerance: 1e-5 absolute on every parameter after the rounds run here (observed ~3e-8: batched
matmuls and weighted means only sum in a different order). Packing and chunking do not change
the lock-step results at all.
"""

from __future__ import annotations

import dataclasses
import logging

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from policies.objective.ce import CEParams, CrossEntropy
from raymm.app.api import run
from raymm.app.build import load_scenario
from raymm.device.lockstep_host import LockstepHost
from raymm.models.network import MultimodalNet
from raymm.protocol.losses import sample_mean
from raymm.protocol.messages import ClusterModels
from raymm.protocol.seams import LossInputs, Objective
from raymm.training._kernels.lockstep_encoder import LockstepEncoder
from raymm.training.local_update import FunctionalOptimizer, OptimizerState
from raymm.training.lockstep.encoders import SensorEncoders
from raymm.training.lockstep.fallback import why_not_lockstep

from helpers import host_round, tiny_scenario
from needs import needs_batch_invariant_matmul

TOL = 1e-5


def _params(overrides: dict) -> tuple[dict[str, np.ndarray], list[dict]]:
    res = run(load_scenario(tiny_scenario(**{"rounds": 3, **overrides})), out=None)
    return res.params, res.rows


@pytest.fixture(autouse=True)
def _out_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # run(out=None) writes under ./runs


@pytest.mark.parametrize("extra", [
    {},                                                           # plain CE, SGD
    {"objective": {"name": "ce", "mu": 0.5}, "training.momentum": 0.9,
     "training.weight_decay": 0.01},                              # FedProx, momentum, decay
    {"training.optimizer": "adam", "training.lr": 0.01, "training.local_epochs": 2},
    # lock-step Adam adds the proximal term outside the loss (`LockstepAdam`)
    {"objective": {"name": "ce", "mu": 2.0}, "training.optimizer": "adam", "training.lr": 0.01,
     "training.batch_size": 7},
    {"training.upload": "held", "training.batch_size": 7},       # pod-wise, many padded batches
    # devices of a bucket with 3-6 steps per epoch: those set aside rejoin in epoch 2
    {"training.batch_size": 7, "training.local_epochs": 2, "training.momentum": 0.9},
    {"training.optimizer": "adam", "training.lr": 0.01, "training.batch_size": 7},
    # under Adam those set aside rejoin having skipped steps: their own bias correction
    {"training.optimizer": "adam", "training.lr": 0.01, "training.batch_size": 7,
     "training.local_epochs": 2},
    # convolutional encoders: the lock-step path convolves in blocks of devices
    {"dataset.sensors": {"a": {"dim": 3, "length": 32, "informativeness": 1.0},
                         "b": {"dim": 2, "length": 32, "informativeness": 0.5}},
     "model.encoder": "cnn1d", "training.optimizer": "adam", "training.lr": 0.01},
    {"dataset.sensors": {"a": {"dim": 8, "length": 12, "informativeness": 1.0},
                         "b": {"dim": 6, "length": 12, "informativeness": 0.5}},
     "model.encoder": "cnn2d"},
], ids=["ce", "fedprox-momentum", "adam-2-epochs", "fedprox-adam-batch7", "held-batch7",
        "momentum-2-epochs-batch7", "adam-batch7", "adam-2-epochs-batch7", "cnn1d-adam", "cnn2d"])
def test_lockstep_matches_sequential(extra):
    seq, seq_rows = _params({**extra, "execution.training.path": "sequential"})
    vec, vec_rows = _params({**extra, "execution.training.path": "lockstep"})
    assert seq.keys() == vec.keys()
    for g in seq:
        np.testing.assert_allclose(vec[g], seq[g], rtol=0, atol=TOL, err_msg=g)
    np.testing.assert_allclose([r["train_loss"] for r in vec_rows],
                               [r["train_loss"] for r in seq_rows], atol=TOL)


@needs_batch_invariant_matmul
@pytest.mark.parametrize("extra", [
    {},
    {"training.batch_size": 7, "training.local_epochs": 2, "training.momentum": 0.9},
    {"training.optimizer": "adam", "training.lr": 0.01, "training.batch_size": 7},
    {"training.optimizer": "adam", "training.lr": 0.01, "training.batch_size": 7,
     "training.local_epochs": 2},
], ids=["ce", "momentum-2-epochs-batch7", "adam-batch7", "adam-2-epochs-batch7"])
def test_packing_and_chunking_do_not_change_lockstep_results(extra):
    """Chunks of one device train each device alone; a device's numbers must not depend on
    the devices (with other step counts, set aside and rejoining) it shares a program with."""
    base = {"execution.training.path": "lockstep", "selection.k": 8, "rounds": 3, **extra}
    ref, _ = _params(base)
    for per, chunk in [(1, 512), (5, 2), (3, 1)]:
        got, _ = _params({**base, "execution.devices_per_actor": per,
                          "execution.training.chunk": chunk})
        for g in ref:
            assert np.array_equal(got[g], ref[g]), (per, chunk, g)


class _PerSensorSet(CrossEntropy):
    """Cross-entropy without `mixes_sensor_sets`: one program per sensor set."""

    mixes_sensor_sets = False


@pytest.mark.parametrize("training", [{}, {"optimizer": "adam", "lr": 0.01, "batch_size": 5,
                                            "local_epochs": 2, "upload": "held"}],
                         ids=["sgd", "adam-2-epochs-held"])
@pytest.mark.parametrize("mixes", [True, False], ids=["mixed", "per-sensor-set"])
def test_every_selected_device_is_trained_in_lock_step(training, mixes):
    """Whatever its steps per epoch, each device trains in exactly one program: one for the
    whole host when the objective mixes sensor sets (devices without a sensor's group then
    keep it as received), else one per tier."""
    objective = None if mixes else _PerSensorSet(CEParams())
    seq, vec, plan, bcast = host_round(training, objective=objective)
    assert isinstance(vec, LockstepHost) and vec.lockstep is not None
    assert vec.spec.objective.mixes_sensor_sets is mixes
    calls = []
    original = vec.lockstep._train_chunk
    vec.lockstep._train_chunk = lambda reqs, *a: calls.append([r.device for r in reqs]) or \
        original(reqs, *a)
    a, b = seq.train(plan, bcast), vec.train(plan, bcast)
    assert sorted(d for c in calls for d in c) == plan.selected.tolist()
    tier = {d: vec.pop.sensor_mask[d].tobytes() for d in plan.selected.tolist()}
    assert len(set(tier.values())) == 3
    if mixes:
        assert len(calls) == 1
    else:
        assert len(calls) == 3 and all(len({tier[d] for d in c}) == 1 for c in calls)
    assert a.device_ids.tolist() == b.device_ids.tolist() == plan.selected.tolist()
    assert a.updates.keys() == b.updates.keys()
    for g in a.updates:
        np.testing.assert_allclose(b.updates[g], a.updates[g], atol=TOL)
        assert np.array_equal(a.senders[g], b.senders[g])
    np.testing.assert_allclose(b.loss, a.loss, atol=TOL)


def test_a_group_a_device_does_not_train_stays_as_received_in_a_mixed_program():
    """Pod-wise upload in one program for every sensor set: a device's encoder of a sensor it
    lacks gets gradients through its zero input, which are dropped; Adam then leaves it
    exactly as broadcast, and the device does not send it."""
    _, vec, plan, bcast = host_round({"optimizer": "adam", "lr": 0.01, "local_epochs": 2,
                                      "upload": "held"})
    runs = vec.lockstep.run([vec._request(d, vec.groups_of(vec.pop.sensor_mask[d], plan))
                        for d in plan.selected.tolist()], plan.round, bcast)
    assert len(runs) == 1
    run_ = runs[0]
    lacking = 0
    for i, r in enumerate(run_.reqs):
        for g in run_.groups:
            if g not in r.groups:
                lacking += 1
                assert np.array_equal(run_.flat[g][i], bcast.params[g]), (r.device, g)
            else:
                assert not np.array_equal(run_.flat[g][i], bcast.params[g]), (r.device, g)
    assert lacking >= 3


def _same_result(a, b):
    assert a.device_ids.tolist() == b.device_ids.tolist()
    assert a.updates.keys() == b.updates.keys() and a.partials.keys() == b.partials.keys()
    for g in a.updates:
        assert np.array_equal(a.updates[g], b.updates[g]) and a.updates[g].dtype == np.float32
        assert np.array_equal(a.senders[g], b.senders[g])
    for g in a.partials:
        for f in ("blocks", "sums", "weights", "senders"):
            assert np.array_equal(getattr(a.partials[g], f), getattr(b.partials[g], f))
    for f in ("num_samples", "compute_seconds", "loss", "failed"):
        assert np.array_equal(getattr(a, f), getattr(b, f)), f
    assert (a.extras, a.states, a.reports, a.errors) == (b.extras, b.states, b.reports, b.errors)


@needs_batch_invariant_matmul
@pytest.mark.parametrize("combine", [False, True])
def test_a_plain_round_hands_the_rows_out_as_device_by_device_would(combine):
    """Nothing kept or reported per device: the lock-step rows become the result directly.
    Three tiers train as three buckets whose ids interleave; the result is the one the
    device-by-device hand-out gives, bit for bit, pre-summed blocks included."""
    _, vec, plan, bcast = host_round({})
    vec.spec = dataclasses.replace(vec.spec, combine=combine)
    taken = []
    plain = vec._train_plain
    vec._train_plain = lambda *a: taken.append(1) or plain(*a)
    fast = vec.train(plan, bcast)
    assert taken and vec._plain(plan, bcast)
    vec._plain = lambda *a: False
    _same_result(fast, vec.train(plan, bcast))
    assert len(taken) == 1 and (bool(fast.partials) == combine)
    # a unimodal report or a broadcast with cluster models goes device by device
    plan_r = dataclasses.replace(plan, report=("a",))
    del vec._plain
    assert not vec._plain(plan_r, bcast)
    clusters = ClusterModels({}, {}, {})
    assert not vec._plain(plan, dataclasses.replace(bcast, clusters=clusters))


@pytest.mark.lockstep_fallback
def test_a_plain_round_whose_bucket_fails_goes_device_by_device(caplog):
    """A bucket that raises under vmap trains sequentially: the plain round hands every
    device out one by one after all, with the same numbers, and says how many fell back."""
    seq, vec, plan, bcast = host_round({}, objective=_Branchy())
    assert vec._plain(plan, bcast)
    with caplog.at_level(logging.WARNING, logger="raymm.training.lockstep"):
        b = vec.train(plan, bcast)
    assert "train sequentially" in caplog.text
    assert sum(b.lockstep_fallbacks.values()) == plan.selected.size
    _same_result(seq.train(plan, bcast), b)


class _NotOptedIn(Objective):
    uses_adapter = False

    def loss(self, inp: LossInputs) -> torch.Tensor:
        return F.cross_entropy(inp.out.logits, inp.y)


class _Branchy(_NotOptedIn):
    """Claims to be vectorisable but branches on a tensor value: vmap raises."""

    vectorisable = True

    def loss(self, inp: LossInputs) -> torch.Tensor:
        loss = F.cross_entropy(inp.out.logits, inp.y, reduction="none")
        return loss.mean() if float(loss.max().detach()) > 0 else loss.sum()


def test_objective_without_opt_in_trains_sequentially_and_says_why(caplog):
    assert "vectorisable" in why_not_lockstep(_NotOptedIn())
    with caplog.at_level(logging.INFO, logger="raymm.training.lockstep"):
        seq, vec, plan, bcast = host_round({}, objective=_NotOptedIn())
    assert vec.lockstep is None and "does not declare" in caplog.text
    a, b = seq.train(plan, bcast), vec.train(plan, bcast)
    for g in a.updates:
        assert np.array_equal(a.updates[g], b.updates[g])


@pytest.mark.lockstep_fallback
def test_a_bucket_that_fails_under_vmap_falls_back_to_sequential(caplog):
    seq, vec, plan, bcast = host_round({}, objective=_Branchy())
    with caplog.at_level(logging.WARNING, logger="raymm.training.lockstep"):
        b = vec.train(plan, bcast)
    a = seq.train(plan, bcast)
    assert "train sequentially" in caplog.text and b.failed.size == 0
    # counted by reason: vmap refuses the loss's `float(...)` of a batched tensor
    (why, n), = b.lockstep_fallbacks.items()
    assert n == plan.selected.size and why.startswith("RuntimeError: ")
    for g in a.updates:
        assert np.array_equal(a.updates[g], b.updates[g])


class _WithHooks(Objective):
    """Uses the adapter, augments with draws from the device's generator (zeroes the first held
    sensor in some batches) and reports per-class mean embeddings: the hooks TIDE needs."""

    uses_adapter = True
    vectorisable = True

    def loss(self, inp: LossInputs) -> torch.Tensor:
        ce = F.cross_entropy(inp.out.logits, inp.y, reduction="none")
        return sample_mean(ce, inp.weight) + 0.1 * sample_mean(inp.out.z.pow(2).sum(1),
                                                               inp.weight)

    def augment(self, xb, present, held, sensors, gen):
        if len(held) >= 2 and float(torch.rand(1, generator=gen)) < 0.5:
            j = sensors.index(held[0])
            xb = {**xb, held[0]: torch.zeros_like(xb[held[0]])}
            present = present.clone()
            present[:, j] = 0.0
        return xb, present

    def device_extras(self, model, xs, y, held_t, use_adapter):
        out = model(xs, held_t.expand(y.shape[0], -1), use_adapter=use_adapter)
        sums = torch.zeros(4, out.z.shape[1]).index_add_(0, y, out.z)
        return {"class_sums": sums.detach().numpy()}


def test_adapter_augmentation_and_device_extras_match_sequential():
    seq, vec, plan, bcast = host_round({"local_epochs": 2, "batch_size": 5, "upload": "held"},
                                        objective=_WithHooks(), **{"model.adapter": True})
    for _ in range(2):  # the second round starts from each device's own trained adapter
        a, b = seq.train(plan, bcast), vec.train(plan, bcast)
    for g in a.updates:
        np.testing.assert_allclose(b.updates[g], a.updates[g], atol=TOL)
    np.testing.assert_allclose(b.extras["class_sums"], a.extras["class_sums"], atol=1e-4)
    for dev in plan.selected.tolist():
        np.testing.assert_allclose(vec.states[dev].adapter, seq.states[dev].adapter, atol=TOL)


class _CountsRows(_WithHooks):
    """`_WithHooks`, also noting how many rows each augment call is given."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, ...]] = []

    def augment(self, xb, present, held, sensors, gen):
        self.rows.append((present.shape[0], *(x.shape[0] for x in xb.values())))
        return super().augment(xb, present, held, sensors, gen)


def test_augment_is_given_a_devices_real_rows_only():
    """A lock-step program hands the hook each device's minibatch without the padding rows of
    its short last batch, as the sequential path does: the same calls with the same row counts
    (some devices here end an epoch with a short batch, the others do not)."""
    seen = []
    for path in (0, 1):
        objective = _CountsRows()
        trainers = host_round({"local_epochs": 2, "batch_size": 5, "upload": "held"},
                              objective=objective, **{"model.adapter": True})
        trainers[path].train(trainers[2], trainers[3])
        seen.append(sorted(objective.rows))
    assert seen[0] == seen[1]
    assert any(r[0] < 5 for r in seen[0]) and any(r[0] == 5 for r in seen[0])


@pytest.mark.parametrize("opt", ["sgd", "adam"])
def test_functional_optimizer_is_torch_optim(opt):
    from raymm.config.schema import TrainingSpec

    t = TrainingSpec(optimizer=opt, lr=0.05, momentum=0.9 if opt == "sgd" else 0.0,
                     weight_decay=0.01)
    w0 = torch.tensor([[1.0, -2.0], [0.5, 3.0]])
    ref = torch.nn.Parameter(w0.clone())
    torch_opt = (torch.optim.Adam([ref], lr=t.lr, weight_decay=t.weight_decay) if opt == "adam"
                 else torch.optim.SGD([ref], lr=t.lr, momentum=t.momentum,
                                      weight_decay=t.weight_decay))
    f = FunctionalOptimizer(t)
    params = {"w": w0.clone().unsqueeze(0).expand(3, 2, 2)}  # three devices, same start
    state = OptimizerState()
    for _ in range(4):
        torch_opt.zero_grad()
        (ref ** 3).sum().backward()
        torch_opt.step()
        params, state = f.step(params, {"w": 3 * params["w"] ** 2}, state)
    for i in range(3):
        torch.testing.assert_close(params["w"][i], ref.detach(), rtol=1e-6, atol=1e-6)


class _HeadUnused(Objective):
    """A loss of the fused representation alone: the task head gets no gradient."""

    uses_adapter = False
    vectorisable = True

    def loss(self, inp: LossInputs) -> torch.Tensor:
        return sample_mean(inp.out.z.pow(2).sum(1), inp.weight)


def test_a_parameter_the_loss_does_not_use_takes_no_step_on_either_path():
    """With weight decay and momentum a zero gradient would still move it (torch.optim skips
    a parameter without gradient, and so do both paths)."""
    seq, vec, plan, bcast = host_round({"weight_decay": 0.1, "momentum": 0.9, "batch_size": 7},
                                       objective=_HeadUnused())
    a, b = seq.train(plan, bcast), vec.train(plan, bcast)
    head = [s for s in vec.lockstep.layout.slots["shared"] if s.name.startswith("head.")]
    assert head
    for res in (a, b):
        for s in head:
            start = bcast.params["shared"][s.start:s.stop]
            assert np.array_equal(res.updates["shared"][:, s.start:s.stop],
                                  np.broadcast_to(start, (len(res.updates["shared"]),
                                                          start.size)))
    np.testing.assert_allclose(b.updates["shared"], a.updates["shared"], atol=TOL)


class _GradMean(Objective):
    """Reports what `device_finish` sees: the steps taken and the mean gradients."""

    uses_adapter = False
    vectorisable = True
    needs_grad_mean = True

    def loss(self, inp: LossInputs) -> torch.Tensor:
        return sample_mean(F.cross_entropy(inp.out.logits, inp.y, reduction="none"), inp.weight)

    def device_finish(self, fin):
        sent = {"steps": np.array([fin.steps], np.float32)}
        sent.update({f"grad/{g}": v for g, v in fin.grad_mean.items()})
        return {}, sent


def test_steps_and_mean_gradients_are_each_devices_own():
    """Devices of one bucket with different steps per epoch (batch 5: 2 to 12 steps, two
    epochs): `DeviceFinish.steps` and the mean gradients count the device's own steps."""
    seq, vec, plan, bcast = host_round({"batch_size": 5, "local_epochs": 2},
                                       objective=_GradMean())
    a, b = seq.train(plan, bcast), vec.train(plan, bcast)
    sizes = np.array([vec.pop.indices(d).shape[0] for d in plan.selected.tolist()])
    assert len(set((-(-sizes // 5)).tolist())) > 2
    np.testing.assert_array_equal(b.extras["steps"][:, 0], 2 * -(-sizes // 5))
    np.testing.assert_array_equal(a.extras["steps"], b.extras["steps"])
    grads = [k for k in a.extras if k.startswith("grad/")]
    assert grads
    for k in grads:
        np.testing.assert_allclose(b.extras[k], a.extras[k], atol=TOL, err_msg=k)
    np.testing.assert_allclose(b.loss, a.loss, atol=TOL)


def test_lock_step_is_the_default_and_a_run_that_cannot_use_it_says_why_once(capsys):
    """`execution.training.path` defaults to lock-step; a scenario whose objective does not opt
    in trains sequentially, and the run says so once on stderr, naming the reason."""
    from raymm.config.schema import EngineSpec

    assert EngineSpec().path == "lockstep"
    run(load_scenario(tiny_scenario(rounds=1)), out=None)
    assert "notice" not in capsys.readouterr().err
    run(load_scenario(tiny_scenario(rounds=1, method="fedproto")), out=None)
    err = capsys.readouterr().err
    assert err.count("raymm: notice: devices train sequentially") == 1
    assert "does not declare `vectorisable = True`" in err


def test_convolutional_encoders_in_lock_step_do_not_depend_on_the_packing():
    """Under vmap a convolution with per-device weights is one grouped convolution; oneDNN
    picks its algorithm by the group and channel counts, so on a CPU a device's bits depended
    on how many devices shared its program (1-2 against 3 or more with 3 channels per device).
    Lock-step programs convolve in blocks of a fixed number of devices
    (`raymm.training._kernels.lockstep_conv`): one host, hosts of 1 and of 5 devices give the
    same bits."""
    sensors = {"a": {"dim": 3, "length": 32, "informativeness": 1.0},
               "b": {"dim": 2, "length": 32, "informativeness": 0.5}}
    base = {"dataset.sensors": sensors, "model.encoder": "cnn1d", "selection.k": 8,
            "rounds": 2, "execution.training.path": "lockstep"}
    ref, _ = _params(base)
    for per in (1, 5):
        got, _ = _params({**base, "execution.devices_per_actor": per})
        for g in ref:
            assert np.array_equal(got[g], ref[g]), (per, g)


def test_a_sensor_a_device_lacks_runs_its_encoder_on_one_zero_sample(monkeypatch):
    """In a program that mixes sensor sets, a device that lacks a sensor and does not train its
    encoder has one embedding of it all round: the devices that hold the sensor run its encoder
    on their minibatch, the others on a single zero sample (`raymm.training.lockstep.encoders`).
    The same numbers as every encoder on every device's batch, to float32 rounding, and still
    the same bits whatever the packing."""
    sensors = {"a": {"dim": 3, "length": 32, "informativeness": 1.0},
               "b": {"dim": 2, "length": 32, "informativeness": 0.5}}
    base = {"dataset.sensors": sensors, "model.encoder": "cnn1d", "selection.k": 8,
            "rounds": 2, "execution.training.path": "lockstep", "training.upload": "held",
            "training.optimizer": "adam", "training.lr": 0.01, "training.batch_size": 7}
    batch_sizes: list[int] = []
    encode = SensorEncoders._encode
    monkeypatch.setattr(SensorEncoders, "_encode", lambda self, m, p, x:
                        batch_sizes.append(int(x.shape[1])) or encode(self, m, p, x))
    ref, _ = _params(base)
    assert 1 in batch_sizes and max(batch_sizes) == 7
    for per in (1, 5):
        got, _ = _params({**base, "execution.devices_per_actor": per})
        for g in ref:
            assert np.array_equal(got[g], ref[g]), (per, g)
    batch_sizes.clear()
    monkeypatch.setattr(MultimodalNet, "takes_embeddings", False)
    every, _ = _params(base)
    assert not batch_sizes
    for g in ref:
        np.testing.assert_allclose(every[g], ref[g], rtol=0, atol=TOL, err_msg=g)


def test_per_device_convolutions_without_the_custom_operator_give_the_same_bits(monkeypatch):
    """`lockstep_conv._direct` makes the grouped call of `lockstep_conv`'s vmap rule without the
    custom operator's Python layers: a lock-step run is bit for bit the run through the
    operator, forward and backward."""
    import raymm.training._kernels.lockstep_conv as lc

    sensors = {"a": {"dim": 3, "length": 32, "informativeness": 1.0},
               "b": {"dim": 2, "length": 32, "informativeness": 0.5}}
    base = {"dataset.sensors": sensors, "model.encoder": "cnn1d", "selection.k": 8,
            "rounds": 2, "execution.training.path": "lockstep", "training.optimizer": "adam",
            "training.lr": 0.01}
    calls = []
    direct = lc._direct
    monkeypatch.setattr(lc, "_direct", lambda *a: calls.append(1) or direct(*a))
    # the encoders under vmap, where `_direct` serves (not as `LockstepEncoder`'s own calls)
    monkeypatch.setattr(LockstepEncoder, "of", classmethod(lambda cls, call, encoder: None))
    ref, _ = _params(base)
    assert calls
    monkeypatch.setattr(lc, "_direct", lambda *a: None)
    via_operator, _ = _params(base)
    for g in ref:
        assert np.array_equal(via_operator[g], ref[g]), g


def test_encoders_run_as_their_own_layer_calls_give_the_vmapped_run_bit_for_bit(monkeypatch):
    """`LockstepEncoder` runs known encoders without vmap, in a closed-form step (TIDE), in a
    step through the model's loss (cross-entropy, 1-D and 2-D CNNs) and for the devices that
    hold a sensor (`SensorEncoders`): whole lock-step runs equal the runs with every encoder
    under vmap."""
    planned = []
    of = LockstepEncoder.of.__func__

    def watched(cls, call, encoder):  # noqa: ANN001, ANN202
        plan = of(cls, call, encoder)
        planned.append(plan is not None)
        return plan
    sensors = {"a": {"dim": 3, "length": 32, "informativeness": 1.0},
               "b": {"dim": 2, "length": 32, "informativeness": 0.5}}
    # the tiny scenario's tiers mix sensor sets: `SensorEncoders` runs for both methods; the
    # 2-D CNN's adaptive pool too
    for extra in ({}, {"method": "tide", "aggregation": {"name": "tide", "warmup": 1}},
                  {"model.encoder": "cnn2d"}):
        base = {"dataset.sensors": sensors, "model.encoder": "cnn1d", "selection.k": 8,
                "rounds": 2, "execution.training.path": "lockstep", "training.optimizer": "adam",
                "training.lr": 0.01, **extra}
        planned.clear()
        monkeypatch.setattr(LockstepEncoder, "of", classmethod(watched))
        stacked, _ = _params(base)
        assert planned and all(planned)
        monkeypatch.setattr(LockstepEncoder, "of", classmethod(lambda cls, call, encoder: None))
        under_vmap, _ = _params(base)
        for g in stacked:
            assert np.array_equal(under_vmap[g], stacked[g]), (extra, g)


def test_per_device_convolutions_under_nested_vmap_take_the_operator():
    """Two vmap levels (devices, then something inside a device) are not the simple case
    `_direct` unwraps: the custom operator's rule computes them, and each result is the plain
    convolution's."""
    from torch.func import vmap

    from raymm.training._kernels.lockstep_conv import blocked_convolutions

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 2, 4, 5, 16, generator=gen)        # devices, inner, batch, C, L
    w = torch.randn(3, 6, 5, 3, generator=gen)            # devices, O, C, K
    with blocked_convolutions():
        out = vmap(lambda xd, wd: vmap(lambda xi: F.conv1d(xi, wd, padding=1))(xd))(x, w)
    for d in range(3):
        for i in range(2):
            torch.testing.assert_close(out[d, i], F.conv1d(x[d, i], w[d], padding=1))


def _device_zero(devices: int, channels: int, two_d: bool) -> dict[str, torch.Tensor]:
    """Device 0's tensors, output and gradients from one blocked convolution of `devices`
    devices: device 0's inputs fixed, the others' drawn afresh."""
    from torch.func import vmap

    from raymm.training._kernels.lockstep_conv import blocked_convolutions

    space, kernel = ((9, 11), (3, 3)) if two_d else ((24,), (5,))
    fixed, other = torch.Generator().manual_seed(0), torch.Generator().manual_seed(devices)

    def draw(*shape: int) -> torch.Tensor:
        return torch.cat([torch.randn(1, *shape, generator=fixed),
                          torch.randn(devices - 1, *shape, generator=other)]).requires_grad_()

    x, w, b = draw(4, channels, *space), draw(6, channels, *kernel), draw(6)
    with blocked_convolutions():
        conv = F.conv2d if two_d else F.conv1d  # as routed while the block lasts
        out = vmap(lambda xd, wd, bd: conv(xd, wd, bd, stride=2, padding=1))(x, w, b)
    out.backward(torch.linspace(-1, 1, out[0].numel()).reshape(out[0].shape).expand_as(out))
    return {"x": x[0].detach(), "w": w[0].detach(), "b": b[0].detach(),
            "output": out[0].detach(), "weight grad": w.grad[0], "bias grad": b.grad[0],
            "input grad": x.grad[0]}


@pytest.mark.parametrize("two_d", [False, True])
@pytest.mark.parametrize("channels", [1, 3, 16])
def test_a_blocked_convolution_gives_a_device_the_same_bits_whatever_the_device_count(
        channels, two_d):
    """The grouped channels-last call of `raymm.training._kernels.lockstep_conv` computes a device's
    output and gradients alike whether 1, 2, 3, 5, 9 or 17 devices share it (fewer than the
    minimum are padded with zero devices), for 1-D and 2-D convolutions; and the output is the
    plain convolution's."""
    ref = _device_zero(1, channels, two_d)
    for devices in (2, 3, 5, 9, 17):
        got = _device_zero(devices, channels, two_d)
        for name in ("output", "weight grad", "bias grad", "input grad"):
            assert torch.equal(got[name], ref[name]), (devices, name)
    plain = (F.conv2d if two_d else F.conv1d)(ref["x"], ref["w"], ref["b"], stride=2, padding=1)
    torch.testing.assert_close(ref["output"], plain)


@pytest.mark.parametrize("input_grad", [False, True])
def test_a_wide_convolutions_weight_gradient_in_blocks_of_devices_has_the_same_bits(
        monkeypatch, input_grad):
    """A grouped call of many devices whose channel count is off oneDNN's 8-channel blocking
    (FedMChain's 129-bin spectrograms) computes its weight and bias gradients in blocks of a
    few devices (`lockstep_conv._WeightGradInBlocks`): output, input, weight and bias
    gradients are the bits of the single call, for a block that ends short of the block size
    too."""
    from torch.func import vmap

    import raymm.training._kernels.lockstep_conv as lc

    def grads(wide: int) -> tuple[torch.Tensor | None, ...]:
        monkeypatch.setattr(lc, "WIDE_CALL_CHANNELS", wide)
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(7, 4, 33, 21, generator=gen).requires_grad_(input_grad)
        w = (torch.randn(7, 6, 33, 5, generator=gen) / 8).requires_grad_()
        b = torch.randn(7, 6, generator=gen).requires_grad_()
        with lc.blocked_convolutions():
            out = vmap(lambda xd, wd, bd: F.conv1d(xd, wd, bd, stride=2, padding=2))(x, w, b)
        out.relu().backward(torch.linspace(-1, 1, out.numel()).reshape(out.shape))
        return out.detach(), x.grad, w.grad, b.grad

    blocks = []
    device_blocks = lc._device_blocks
    monkeypatch.setattr(lc, "_device_blocks", lambda *a: blocks.append(device_blocks(*a))
                        or blocks[-1])
    monkeypatch.setattr(lc, "BLOCK_CHANNELS", 3 * 33)
    one_call = grads(10**9)
    assert not blocks
    in_blocks = grads(33)
    assert blocks == [[(0, 3), (3, 7)]]     # a last block of one device joins the one before
    for name, a, b in zip(("output", "input grad", "weight grad", "bias grad"), one_call,
                          in_blocks):
        assert (a is None and b is None) if name == "input grad" and not input_grad \
            else torch.equal(a, b), name


def test_a_global_average_pool_of_per_device_tensors_is_their_mean_without_a_fallback():
    """Within a lock-step program a global average pool of per-device tensors (the channels-last
    results of blocked convolutions) is a plain mean: the plain pool's numbers, and no vmap
    fallback that would loop over devices (torch warns of one when it happens)."""
    import warnings

    from torch.func import vmap

    from raymm.training._kernels.lockstep_conv import blocked_convolutions

    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(5, 4, 3, 20, generator=gen), torch.randn(5, 8, 3, 5, generator=gen)
    img, k = torch.randn(5, 4, 3, 9, 9, generator=gen), torch.randn(5, 8, 3, 3, 3, generator=gen)
    with warnings.catch_warnings(record=True) as caught, blocked_convolutions():
        warnings.simplefilter("always")
        one = vmap(lambda xd, wd: F.adaptive_avg_pool1d(F.conv1d(xd, wd, padding=2), 1))(x, w)
        two = vmap(lambda xd, wd: F.adaptive_avg_pool2d(F.conv2d(xd, wd, padding=1), 1))(img, k)
        keep = vmap(lambda xd, wd: F.adaptive_avg_pool2d(F.conv2d(xd, wd, padding=1), 2))(img, k)
    assert not [c for c in caught if "performance drop" in str(c.message)]
    for d in range(5):
        conv1, conv2 = F.conv1d(x[d], w[d], padding=2), F.conv2d(img[d], k[d], padding=1)
        torch.testing.assert_close(one[d], F.adaptive_avg_pool1d(conv1, 1))
        torch.testing.assert_close(two[d], F.adaptive_avg_pool2d(conv2, 1))
        torch.testing.assert_close(keep[d], F.adaptive_avg_pool2d(conv2, 2))


def test_an_interleaved_minibatch_reaches_a_convolution_as_a_view_with_the_same_bits():
    """A `[T, C]` series with many channels is gathered device-interleaved for a lock-step
    program (`lockstep_conv.interleaved_rows`): the same values as a plain gather, still so
    after picking devices (`select_devices`), and the grouped convolution reads it without
    copying the minibatch, to the same bits as from a plain gather."""
    from torch.func import vmap
    from torch.utils._python_dispatch import TorchDispatchMode

    from raymm.models.encoders import make_encoder
    from raymm.training._kernels.lockstep_conv import (
        blocked_convolutions,
        interleaved_rows,
        select_devices,
        takes_interleaved,
    )

    gen = torch.Generator().manual_seed(0)
    data = torch.randn(40, 21, 17, generator=gen)              # samples, T, C
    rows = torch.randint(0, 40, (5, 6), generator=gen)         # devices, batch
    plain = data.index_select(0, rows.reshape(-1)).view(5, 6, 21, 17)
    inter = interleaved_rows(data, rows)
    assert torch.equal(inter, plain) and inter.permute(1, 2, 0, 3).is_contiguous()
    pick = torch.tensor([4, 1, 2])
    picked = select_devices(inter, pick)
    assert torch.equal(picked, plain.index_select(0, pick))
    assert picked.permute(1, 2, 0, 3).is_contiguous()

    encoder = make_encoder("cnn1d", (21, 17), 8, 16)
    assert takes_interleaved(encoder, (21, 17)) and not takes_interleaved(encoder, (21, 3))
    weights = {n: torch.randn(5, *p.shape, generator=gen) for n, p in encoder.named_parameters()}

    class Copies(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.floats = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
            out = func(*args, **(kwargs or {}))
            if func in (torch.ops.aten.clone.default, torch.ops.aten.copy_.default) and \
                    out.numel() == plain.numel():
                self.floats += out.numel()   # a copy of the minibatch
            return out

    def encode(x: torch.Tensor) -> tuple[torch.Tensor, int]:
        with blocked_convolutions(), Copies() as copies:
            out = vmap(lambda p, xb: torch.func.functional_call(encoder, p, (xb,)))(weights, x)
        return out, copies.floats

    got, copied = encode(inter)
    ref, copied_plain = encode(plain)
    assert torch.equal(got, ref)
    assert copied_plain == plain.numel() and copied == 0   # a plain gather is moved, not this
