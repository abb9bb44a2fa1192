"""FedMChain's MCFT stage trains in lock-step (raymm.training.lockstep) and agrees with the
sequential
path: per-device start vectors (cluster models, parameters kept under `exchange: delta`) and
frozen earlier-modality branches that differ per device.

Tolerance on server params, cluster models and every device's kept vectors after six rounds
(three chain phases, sync every 2 rounds): 1e-4 absolute for all but 0.5% of the values, 1e-3
for every one. Only float32 rounding differs -- summation order, and lock-step Adam's fused
kernel (`raymm.training._kernels.lockstep_adam`), which rounds the update otherwise; Adam turns that
into a
step of up to the learning rate where a gradient is near zero (measured: 2 of 1,174 values
2.4e-4 apart, every other within 8e-6).
"""

from __future__ import annotations

import logging

import numpy as np
import torch

from policies.objective.mcft import MCFTParams, MCFTStage
from policies.schedule.chain import PRECEDING
from raymm.app.build import build_world, load_scenario
from raymm.device.lockstep_host import LockstepHost
from raymm.models.network import ModelOutput
from raymm.protocol.seams import LossInputs
from raymm.sim.engine import run_round
from raymm.sim.serial import SerialExecutor

from helpers import REPO
from needs import batched_matmul_is_batch_invariant

SCENARIO = REPO / "scenarios" / "fedmchain_synthetic.yaml"
TOL = 1e-4
#: the share of values allowed beyond TOL, and the bound for every value (module docstring)
OUTLIERS, BOUND = 0.005, 1e-3


def _agree(got: np.ndarray, want: np.ndarray, tol: float, what: str) -> None:
    """Every value within BOUND, all but OUTLIERS of them within `tol`."""
    diff = np.abs(np.asarray(got, np.float64) - np.asarray(want, np.float64))
    assert diff.max(initial=0.0) <= BOUND, (what, float(diff.max()))
    assert (diff > tol).mean() <= OUTLIERS, (what, int((diff > tol).sum()), diff.size)


def _run(lockstep: bool, *overrides: str, per_host: int = 5
         ) -> tuple[SerialExecutor, list[float]]:
    sc = load_scenario(SCENARIO, ["rounds=6", "training.sync_every=2", "eval.every=3",
                                  "execution.training.path="
                                  f"{'lockstep' if lockstep else 'sequential'}", *overrides])
    world = build_world(sc)
    ex = SerialExecutor(devices_per_host=per_host)
    ex.start(world)
    losses = [run_round(ex, t, sc).row["train_loss"] for t in range(1, sc.rounds + 1)]
    return ex, losses


def test_mcft_lockstep_matches_sequential(caplog) -> None:
    seq, seq_loss = _run(False)
    with caplog.at_level(logging.WARNING, logger="raymm.training.lockstep"):
        vec, vec_loss = _run(True)
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


def _inputs(weight, b: int = 6, pad: int = 0) -> LossInputs:
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


def _loss(inp: LossInputs) -> torch.Tensor:
    obj = MCFTStage(MCFTParams(lambda_a=0.4, lambda_c=1.0, tau=0.1))
    obj.chain = ("a", "b")
    return obj.loss(inp)


def test_weights_ones_and_padding_keep_the_sequential_loss() -> None:
    assert MCFTStage.vectorisable
    ref = _loss(_inputs(None))
    # hand check of the no-preceding-modality case: plain CE mean
    inp = _inputs(None)
    obj = MCFTStage(MCFTParams())
    obj.chain = ("b", "a")
    torch.testing.assert_close(obj.loss(inp), torch.nn.functional.cross_entropy(
        inp.out.sensor_logits["b"], inp.y))
    torch.testing.assert_close(_loss(_inputs(torch.ones(6))), ref, rtol=0, atol=1e-6)
    # two padding rows appended (weight 0): neither anchors nor candidates, no change
    padded = _loss(_inputs(torch.tensor([1.0] * 6 + [0.0] * 2), pad=2))
    torch.testing.assert_close(padded, ref, rtol=0, atol=1e-5)
    # the padding rows do matter without their zero weight (the test can fail)
    assert not torch.allclose(_loss(_inputs(torch.ones(8), pad=2)), ref, atol=1e-3)


def test_a_frozen_branch_encoded_once_a_round_gives_the_same_bits(monkeypatch) -> None:
    """`LockstepTrainer._frozen_embeddings`: the earlier modalities' encoders (frozen in an MCFT
    stage) run once a round over every sample instead of at every step of every epoch; each
    sample's embedding, hence every number of the run, is the same to the bit. Time-series
    sensors, so the frozen encoders are convolutions (one of them gathered interleaved)."""
    from raymm.training.lockstep.trainer import LockstepTrainer

    series = [f"dataset.sensors.{m}.length=32" for m in ("dom", "mid", "weak")]
    found: list[list[str]] = []
    frozen_sensors = LockstepTrainer._frozen_sensors

    def spy(self, names, helds):  # noqa: ANN001, ANN202
        found.append(frozen_sensors(self, names, helds))
        return found[-1]
    monkeypatch.setattr(LockstepTrainer, "_frozen_sensors", spy)
    cached, cached_loss = _run(True, *series)
    assert any(found) and not all(found)   # the first stage has no earlier modality
    monkeypatch.setattr(LockstepTrainer, "_frozen_sensors", lambda self, names, helds: [])
    plain, plain_loss = _run(True, *series)
    assert cached_loss == plain_loss
    assert cached.server.params.keys() == plain.server.params.keys()
    for g in plain.server.params:
        assert np.array_equal(cached.server.params[g], plain.server.params[g]), g
    models = plain.server.policies.aggregator.models
    assert models and models.keys() == cached.server.policies.aggregator.models.keys()
    for g in models:
        assert np.array_equal(cached.server.policies.aggregator.models[g], models[g]), g


def test_frozen_embeddings_kept_from_an_earlier_round_give_the_same_bits(monkeypatch) -> None:
    """`raymm.training.lockstep.frozen_cache`: a device whose frozen encoder has the weights of an
    earlier
    round's pass takes that pass's embeddings, and programs that mix such devices with others
    compute only the others; every number of the run is the one a fresh pass gives, and the
    one of other packings (one host per device, whose caches hold one device each; one host
    of all devices, where the devices to compute are not the first of their steps)."""
    from raymm.training.lockstep.frozen_cache import FrozenEmbeddingCache
    from raymm.training.lockstep.trainer import LockstepTrainer

    series = [f"dataset.sensors.{m}.length=32" for m in ("dom", "mid", "weak")]
    programs: list[list[bool]] = []
    lookup, frozen = FrozenEmbeddingCache.lookup, LockstepTrainer._frozen_embeddings

    def spy_lookup(self, *a):  # noqa: ANN001, ANN002, ANN202
        found = lookup(self, *a)
        programs[-1].extend(e is not None for e in found)
        return found

    def spy_frozen(self, *a):  # noqa: ANN001, ANN002, ANN202
        programs.append([])
        return frozen(self, *a)
    monkeypatch.setattr(FrozenEmbeddingCache, "lookup", spy_lookup)
    monkeypatch.setattr(LockstepTrainer, "_frozen_embeddings", spy_frozen)
    kept, kept_loss = _run(True, "rounds=9", *series)
    assert any(all(p) for p in programs if p)           # every device's embeddings kept
    assert any(any(p) and not all(p) for p in programs)  # some kept, some computed
    monkeypatch.setattr(FrozenEmbeddingCache, "lookup",
                        lambda self, sensor, devices, *a: [None] * len(devices))
    fresh, fresh_loss = _run(True, "rounds=9", *series)
    assert kept_loss == fresh_loss
    for g in fresh.server.params:
        assert np.array_equal(kept.server.params[g], fresh.server.params[g]), g
    monkeypatch.setattr(FrozenEmbeddingCache, "lookup", spy_lookup)
    alone, alone_loss = _run(True, "rounds=9", *series, per_host=1)
    assert alone_loss == kept_loss
    for g in fresh.server.params:
        assert np.array_equal(alone.server.params[g], kept.server.params[g]), g
    # one host of every device: devices to compute come after kept ones in a program (not the
    # first k of a step), so their rows and weights are picked by index
    programs.clear()
    together, together_loss = _run(True, "rounds=9", *series, per_host=100)
    assert any(True in p and False in p[p.index(True):] for p in programs)
    assert together_loss == kept_loss
    for g in fresh.server.params:
        assert np.array_equal(together.server.params[g], kept.server.params[g]), g


def test_a_frozen_embedding_is_kept_only_for_the_weights_and_samples_it_was_computed_with():
    """The cache checks what it returns: other shared or own weights, other samples, a sensor
    the device no longer holds or another batch size find nothing; it keeps its own copies;
    the least recently used entries leave when it is full; an encoder too big to copy and
    compare cheaply is not kept at all."""
    import torch

    from raymm.training.lockstep.frozen_cache import FrozenEmbeddingCache

    shared = {"conv.weight": torch.arange(6.0).view(2, 3)}
    own = {"conv.bias": torch.ones(2)}
    idx, emb = np.arange(4), torch.ones(8, 2)
    entry = own["conv.bias"].nbytes + idx.nbytes + emb.nbytes
    cache = FrozenEmbeddingCache(max_bytes=max(8 * 32, shared["conv.weight"].nbytes + 2 * entry))

    def look(device: int = 1, sensor: str = "audio", s: dict = shared, o: dict = own,
             i: np.ndarray = idx, held: bool = True, bs: int = 4) -> torch.Tensor | None:
        return cache.lookup(sensor, [device], s, [o], [i], [held], bs)[0]

    assert look() is None
    cache.store("audio", [1], [own], [idx], [True], 4, [emb])
    own["conv.bias"][0] = 7.0               # the caller's buffer moves on: the copy stays
    assert look() is None
    own["conv.bias"][0] = 1.0
    assert torch.equal(look(), emb)
    nudged = {"conv.weight": shared["conv.weight"].clone()}
    nudged["conv.weight"][1, 2] = torch.nextafter(torch.tensor(5.0), torch.tensor(6.0))
    assert look(s=nudged) is None           # another version of the shared weights ...
    assert look() is None                   # ... makes the entries of the old one stale
    cache.store("audio", [1], [own], [idx], [True], 4, [emb])
    assert look(i=idx + 1) is None and look(bs=8) is None and look(held=False) is None
    assert look(sensor="visual") is None and look(device=2) is None
    cache.lookup("audio", [1, 2], shared, [own, own], [idx, idx], [True, True], 4)
    cache.store("audio", [2], [own], [idx], [True], 4, [emb])
    look()                                  # device 1 used last: device 2 leaves first
    cache.lookup("audio", [3], shared, [own], [idx], [True], 4)
    cache.store("audio", [3], [own], [idx], [True], 4, [emb])
    assert look(device=2) is None
    assert look() is not None and look(device=3) is not None
    big = FrozenEmbeddingCache(max_bytes=8 * (shared["conv.weight"].nbytes + 8) - 1)
    assert big.lookup("audio", [1], shared, [own], [idx], [True], 4) == [None]
    big.store("audio", [1], [own], [idx], [True], 4, [emb])
    assert big.lookup("audio", [1], shared, [own], [idx], [True], 4) == [None]
    assert big.hits == 0


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
        skip, skip_loss = _run(lockstep)
        skipped_calls = sum(encoded)
        # the first phase (dom) reads neither mid nor weak; the last reads every held one
        assert any(u.keys() == {"mid", "weak"} for u in unread), unread
        assert all(w == 16 for u in unread for w in u.values())   # the embedding width
        encoded.clear()
        monkeypatch.setattr(MCFTStage, "sensors_read", lambda self, groups, held, extras: None)
        full, full_loss = _run(lockstep)
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
