"""MCFT stage objective (policies.objective.mcft): alignment (InfoNCE), complementarity weights
and the gated sum; under the adaptive order, the probe's loss and the predecessors read from
the broadcast; the encoders a stage's loss does not read are left out. In lock-step
(raymm.training.lockstep) the stage trains as sequentially: weights of ones and padding rows
keep the sequential loss, and whole runs agree with per-device start vectors (cluster models,
parameters kept under `exchange: delta`) and frozen earlier-modality branches that differ per
device.

Tolerance on server params, cluster models and every device's kept vectors after six rounds
(three chain phases, sync every 2 rounds): 1e-4 absolute for all but 0.5% of the values, 1e-3
for every one. Only float32 rounding differs -- summation order, and lock-step Adam's fused
kernel (`raymm.training._kernels.lockstep_adam`), which rounds the update otherwise; Adam
turns that into a step of up to the learning rate where a gradient is near zero (measured: 2
of 1,174 values 2.4e-4 apart, every other within 8e-6).
"""

from __future__ import annotations

import logging
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from policies.objective.mcft import MCFTParams, MCFTStage, complementarity_weights, info_nce
from policies.schedule.chain import PRECEDING
from raymm.device.lockstep_host import LockstepHost
from raymm.errors import ScenarioError
from raymm.models.network import ModelOutput
from raymm.protocol.seams import LossInputs

from helpers import mcft_run
from needs import batched_matmul_is_batch_invariant

TOL = 1e-4
#: the share of values allowed beyond TOL, and the bound for every value (module docstring)
OUTLIERS, BOUND = 0.005, 1e-3


def test_info_nce_hand_computed() -> None:
    a = torch.tensor([[1.0, 0.0], [0.0, 2.0]])      # normalised: e1, e2
    c = torch.tensor([[3.0, 0.0], [0.0, 1.0]])
    # cos = identity; τ = 1: each row -log(e / (e + 1)) = log(1 + e^-1)
    assert info_nce(a, c, 1.0).item() == pytest.approx(math.log(1 + math.exp(-1)), abs=1e-6)
    # τ = 0.5 doubles the logits
    assert info_nce(a, c, 0.5).item() == pytest.approx(math.log(1 + math.exp(-2)), abs=1e-6)
    # swapped candidates: the positives are now orthogonal, the negatives aligned
    assert info_nce(a, c.flip(0), 1.0).item() == pytest.approx(math.log(1 + math.e), abs=1e-6)


def test_complementarity_weights_hand_computed() -> None:
    z = torch.tensor([[0.0, 0.0], [math.log(3.0), 0.0], [0.0, math.log(3.0)]],
                     requires_grad=True)
    y = torch.tensor([0, 0, 0])
    e = complementarity_weights(z, y)
    # softmax(z)[y] = 0.5, 0.75, 0.25 -> e = 0.5, 0.25, 0.75
    torch.testing.assert_close(e, torch.tensor([0.5, 0.25, 0.75]))
    assert not e.requires_grad


def _inputs(held: tuple[str, ...], groups: tuple[str, ...]) -> tuple[LossInputs, dict]:
    g = torch.Generator().manual_seed(0)
    emb = {m: torch.randn(4, 3, generator=g, requires_grad=True) for m in ("a", "v")}
    logits = {m: torch.randn(4, 5, generator=g, requires_grad=True) for m in ("a", "v")}
    y = torch.tensor([0, 1, 2, 3])
    out = ModelOutput(logits["a"] + logits["v"], None, emb, logits)
    return LossInputs(out, y, torch.ones(4, 2), held, {}, {}, groups=groups), \
        {"emb": emb, "logits": logits, "y": y}


def _stage(**kw: float) -> MCFTStage:
    obj = MCFTStage(MCFTParams(**kw))
    obj.bind(SimpleNamespace(schedule=SimpleNamespace(
        name="modality_chain", params=lambda: {"chain": ["a", "v"]})), ("a", "v"))
    return obj


def test_stage_loss_adds_alignment_and_complementarity_for_preceding_modalities() -> None:
    inp, t = _inputs(("a", "v"), ("sensor:v",))
    loss = _stage(lambda_a=0.4, lambda_c=1.0, tau=0.1).loss(inp)
    y = t["y"]
    ce = F.cross_entropy(t["logits"]["v"], y, reduction="none")
    p_prev = torch.softmax(t["logits"]["a"].detach(), 1)[torch.arange(4), y]
    ha = F.normalize(t["emb"]["a"].detach(), dim=1)
    hv = F.normalize(t["emb"]["v"], dim=1)
    r_a = F.cross_entropy(hv @ ha.T / 0.1, torch.arange(4))
    expected = ce.mean() + 0.4 * r_a + 1.0 * ((1 - p_prev) * ce).mean()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)
    loss.backward()
    # the frozen (preceding) modality gets no gradient, through neither term
    assert t["emb"]["a"].grad is None and t["logits"]["a"].grad is None
    assert t["emb"]["v"].grad is not None


@pytest.mark.parametrize("held,groups", [(("v",), ("sensor:v",)),      # no preceding held
                                         (("a", "v"), ("sensor:a",))])  # first phase
def test_stage_loss_is_plain_ce_without_preceding_modalities(held: tuple, groups: tuple) -> None:
    inp, t = _inputs(held, groups)
    m = groups[0].split(":")[1]
    loss = _stage().loss(inp)
    assert loss.item() == pytest.approx(F.cross_entropy(t["logits"][m], t["y"]).item())


def test_ablations_zero_the_terms() -> None:
    inp, t = _inputs(("a", "v"), ("sensor:v",))
    ce = F.cross_entropy(t["logits"]["v"], t["y"]).item()
    assert _stage(lambda_a=0.0, lambda_c=0.0).loss(inp).item() == pytest.approx(ce)
    assert _stage(lambda_a=0.0).loss(inp).item() > ce     # R_c only
    assert _stage(lambda_c=0.0).loss(inp).item() > ce     # R_a only


def test_mcft_needs_the_chain_schedule() -> None:
    with pytest.raises(ScenarioError, match="modality_chain"):
        MCFTStage(MCFTParams()).bind(SimpleNamespace(schedule=SimpleNamespace(
            name="joint", params=lambda: {})), ("a", "v"))


def _adaptive_stage() -> MCFTStage:
    obj = MCFTStage(MCFTParams())
    obj.bind(SimpleNamespace(schedule=SimpleNamespace(
        name="modality_chain", params=lambda: {"order": "adaptive"})), ("a", "v"))
    return obj


def _broadcast_inputs(groups: tuple[str, ...], extras: dict) -> tuple[LossInputs, dict]:
    g = torch.Generator().manual_seed(0)
    emb = {m: torch.randn(4, 3, generator=g, requires_grad=True) for m in ("a", "v")}
    logits = {m: torch.randn(4, 5, generator=g, requires_grad=True) for m in ("a", "v")}
    y = torch.tensor([0, 1, 2, 3])
    out = ModelOutput(logits["a"] + logits["v"], None, emb, logits)
    return LossInputs(out, y, torch.ones(4, 2), ("a", "v"), {}, {}, extras,
                      groups=groups), {"logits": logits, "y": y}


def test_probe_loss_trains_every_branch_on_its_own_cross_entropy() -> None:
    inp, t = _broadcast_inputs(("sensor:a", "sensor:v"), {PRECEDING: torch.zeros(2)})
    loss = _adaptive_stage().loss(inp)
    expected = sum(F.cross_entropy(t["logits"][m], t["y"]) for m in ("a", "v"))
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)


def test_stage_loss_takes_the_predecessors_from_the_broadcast() -> None:
    fixed = MCFTStage(MCFTParams())                  # the fixed chain v -> a
    fixed.bind(SimpleNamespace(schedule=SimpleNamespace(
        name="modality_chain", params=lambda: {"chain": ["v", "a"]})), ("a", "v"))
    inp, _ = _broadcast_inputs(("sensor:a",), {})
    expected = fixed.loss(inp).item()
    # the sensor order (a, v) would make a the first phase; the broadcast says v came first
    inp, t = _broadcast_inputs(("sensor:a",), {PRECEDING: torch.tensor([0.0, 1.0])})
    assert _adaptive_stage().loss(inp).item() == pytest.approx(expected, rel=1e-6)
    assert expected != pytest.approx(F.cross_entropy(t["logits"]["a"], t["y"]).item())
    inp, t = _broadcast_inputs(("sensor:v",), {PRECEDING: torch.tensor([0.0, 0.0])})
    assert _adaptive_stage().loss(inp).item() == pytest.approx(
        F.cross_entropy(t["logits"]["v"], t["y"]).item())


# --- in lock-step ---------------------------------------------------------------------------
def _agree(got: np.ndarray, want: np.ndarray, tol: float, what: str) -> None:
    """Every value within BOUND, all but OUTLIERS of them within `tol`."""
    diff = np.abs(np.asarray(got, np.float64) - np.asarray(want, np.float64))
    assert diff.max(initial=0.0) <= BOUND, (what, float(diff.max()))
    assert (diff > tol).mean() <= OUTLIERS, (what, int((diff > tol).sum()), diff.size)


def test_mcft_lockstep_matches_sequential(caplog) -> None:
    seq, seq_loss = mcft_run(False)
    with caplog.at_level(logging.WARNING, logger="raymm.training.lockstep"):
        vec, vec_loss = mcft_run(True)
    assert all(isinstance(h, LockstepHost) and h.reason is None and h.lockstep is not None
               for h in vec.hosts)
    assert "failed" not in caplog.text and "sequentially" not in caplog.text
    assert not any(isinstance(h, LockstepHost) for h in seq.hosts)
    assert seq.server.params.keys() == vec.server.params.keys()
    # where batched matmul is not batch-invariant (tests/needs.py) the two paths round
    # differently at every step, and after six rounds they stand a few 1e-4 apart
    tol = TOL if batched_matmul_is_batch_invariant() else 1e-3
    for g in seq.server.params:
        _agree(vec.server.params[g], seq.server.params[g], tol, g)
    seq_models = seq.server.policies.aggregator.models
    vec_models = vec.server.policies.aggregator.models
    assert seq_models.keys() == vec_models.keys() and seq_models
    for g in seq_models:
        _agree(vec_models[g], seq_models[g], tol, g)
    seq_dev = {d: s.to_record() for h in seq.hosts for d, s in h.states.items()}
    vec_dev = {d: s.to_record() for h in vec.hosts for d, s in h.states.items()}
    assert seq_dev.keys() == vec_dev.keys() and seq_dev
    for d in seq_dev:
        assert seq_dev[d].keys() == vec_dev[d].keys()
        for k in seq_dev[d]:
            _agree(vec_dev[d][k], seq_dev[d][k], tol, f"{d} {k}")
    np.testing.assert_allclose(vec_loss, seq_loss, atol=tol)


def _weighted(weight, b: int = 6, pad: int = 0) -> LossInputs:
    g = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    n = b + pad  # the same 8 drawn rows, the first n used: padding rows come after real ones
    emb = {m: r(8, 3)[:n] for m in ("a", "b")}
    logits = {m: r(8, 4)[:n] for m in ("a", "b")}
    y = torch.tensor([0, 1, 2, 3, 0, 2, 1, 3][:n])
    out = ModelOutput(logits=logits["a"] + logits["b"], z=r(8, 5)[:n], embeddings=emb,
                      sensor_logits=logits)
    return LossInputs(out, y, torch.ones(n, 2), ("a", "b"), {}, {}, {}, 3,
                      groups=("sensor:b",), weight=weight)


def _stage_loss(inp: LossInputs) -> torch.Tensor:
    obj = MCFTStage(MCFTParams(lambda_a=0.4, lambda_c=1.0, tau=0.1))
    obj.chain = ("a", "b")
    return obj.loss(inp)


def test_weights_ones_and_padding_keep_the_sequential_loss() -> None:
    assert MCFTStage.vectorisable
    ref = _stage_loss(_weighted(None))
    # hand check of the no-preceding-modality case: plain CE mean
    inp = _weighted(None)
    obj = MCFTStage(MCFTParams())
    obj.chain = ("b", "a")
    torch.testing.assert_close(obj.loss(inp), torch.nn.functional.cross_entropy(
        inp.out.sensor_logits["b"], inp.y))
    torch.testing.assert_close(_stage_loss(_weighted(torch.ones(6))), ref, rtol=0, atol=1e-6)
    # two padding rows appended (weight 0): neither anchors nor candidates, no change
    padded = _stage_loss(_weighted(torch.tensor([1.0] * 6 + [0.0] * 2), pad=2))
    torch.testing.assert_close(padded, ref, rtol=0, atol=1e-5)
    # the padding rows do matter without their zero weight (the test can fail)
    assert not torch.allclose(_stage_loss(_weighted(torch.ones(8), pad=2)), ref, atol=1e-3)


def test_encoders_the_stage_loss_does_not_read_are_left_out_with_the_same_bits(monkeypatch
                                                                                ) -> None:
    """`MCFTStage.sensors_read`: a stage's loss reads its own branch and the held earlier ones,
    so the later modalities' encoders do not run (zero embeddings reach the model). Sequential
    and lock-step runs over all three phases give the very numbers of a run that runs every
    encoder, and leave encoders out."""
    from raymm.models import network
    from raymm.training.sequential import SequentialTrainer

    encoded: list[int] = []
    embed = network.embed

    def counting(encoders, sensors, inputs, given):  # noqa: ANN001, ANN202
        encoded.append(sum(m not in (given or {}) for m in sensors))
        return embed(encoders, sensors, inputs, given)
    monkeypatch.setattr(network, "embed", counting)
    unread: list[dict[str, int]] = []
    own_unread = SequentialTrainer.unread

    def spy(self, groups, held, extras):  # noqa: ANN001, ANN202
        unread.append(own_unread(self, groups, held, extras))
        return unread[-1]
    monkeypatch.setattr(SequentialTrainer, "unread", spy)
    for lockstep in (False, True):
        encoded.clear()
        unread.clear()
        skip, skip_loss = mcft_run(lockstep)
        skipped_calls = sum(encoded)
        # the first phase (dom) reads neither mid nor weak; the last reads every held one
        assert any(u.keys() == {"mid", "weak"} for u in unread), unread
        assert all(w == 16 for u in unread for w in u.values())   # the embedding width
        encoded.clear()
        monkeypatch.setattr(MCFTStage, "sensors_read", lambda self, groups, held, extras: None)
        full, full_loss = mcft_run(lockstep)
        monkeypatch.undo()
        monkeypatch.setattr(network, "embed", counting)
        monkeypatch.setattr(SequentialTrainer, "unread", spy)
        assert skipped_calls < sum(encoded), lockstep
        assert skip_loss == full_loss, lockstep
        for g in full.server.params:
            assert np.array_equal(skip.server.params[g], full.server.params[g]), (lockstep, g)
        models = full.server.policies.aggregator.models
        assert models and models.keys() == skip.server.policies.aggregator.models.keys()
        for g in models:
            assert np.array_equal(skip.server.policies.aggregator.models[g], models[g]), g


def test_stage_reads_its_branch_and_the_held_earlier_ones() -> None:
    stage = MCFTStage(MCFTParams())
    stage.chain = ("dom", "mid", "weak")
    both = ("dom", "mid", "weak")
    assert stage.sensors_read(("sensor:dom",), both, {}) == {"dom"}
    assert stage.sensors_read(("sensor:mid",), both, {}) == {"dom", "mid"}
    assert stage.sensors_read(("sensor:weak",), ("mid", "weak"), {}) == {"mid", "weak"}
    assert stage.sensors_read(("sensor:dom", "sensor:mid"), both, {}) == {"dom", "mid"}
    assert stage.sensors_read(("sensor:mid",), both, {PRECEDING: torch.ones(3)}) is None
    assert stage.sensors_read(("shared",), both, {}) is None
