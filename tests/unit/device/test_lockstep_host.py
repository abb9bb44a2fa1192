"""The lock-step host (raymm.device.lockstep_host): every selected device trains in exactly one
program (one for the host, or one per sensor set), a plain round hands the lock-step rows out
as device-by-device would, and an objective that does not opt in, or a program that fails
under vmap, trains sequentially with the same numbers and says why."""

from __future__ import annotations

import dataclasses
import logging

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from policies.objective.ce import CEParams, CrossEntropy
from raymm.device.lockstep_host import LockstepHost
from raymm.protocol.messages import ClusterModels
from raymm.protocol.seams import LossInputs, Objective
from raymm.training.lockstep.fallback import why_not_lockstep

from helpers import host_round
from needs import needs_batch_invariant_matmul

TOL = 1e-5


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
