"""Lock-step (torch.func) local training agrees with the sequential reference path.

Tolerance: 1e-5 absolute on every parameter after the rounds run here (observed ~3e-8: batched
matmuls and weighted means only sum in a different order). Packing and chunking do not change
the lock-step results at all.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from raymm.protocol.losses import sample_mean
from raymm.protocol.seams import LossInputs, Objective

from helpers import host_round, tiny_run_params
from needs import needs_batch_invariant_matmul

TOL = 1e-5


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
    seq, seq_rows = tiny_run_params({**extra, "execution.training.path": "sequential"})
    vec, vec_rows = tiny_run_params({**extra, "execution.training.path": "lockstep"})
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
    ref, _ = tiny_run_params(base)
    for per, chunk in [(1, 512), (5, 2), (3, 1)]:
        got, _ = tiny_run_params({**base, "execution.devices_per_actor": per,
                          "execution.training.chunk": chunk})
        for g in ref:
            assert np.array_equal(got[g], ref[g]), (per, chunk, g)


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
