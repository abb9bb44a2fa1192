"""A frozen encoder's embeddings kept from one round to the next
(raymm.training.lockstep.frozen_cache), on FedMChain's MCFT stages in lock-step: a frozen branch
encoded once a round and embeddings kept from an earlier round give the same bits, and an
embedding is kept only for the weights and samples it was computed with."""

from __future__ import annotations

import numpy as np
import torch

from helpers import mcft_run


def test_a_frozen_branch_encoded_once_a_round_gives_the_same_bits(monkeypatch) -> None:
    """`FrozenEncoders.embeddings`: the earlier modalities' encoders (frozen in an MCFT
    stage) run once a round over every sample instead of at every step of every epoch; each
    sample's embedding, hence every number of the run, is the same to the bit. Time-series
    sensors, so the frozen encoders are convolutions (one of them gathered interleaved)."""
    from raymm.training.lockstep.frozen_cache import FrozenEncoders

    series = [f"dataset.sensors.{m}.length=32" for m in ("dom", "mid", "weak")]
    found: list[list[str]] = []
    frozen_sensors = FrozenEncoders.sensors

    def spy(self, names, helds):  # noqa: ANN001, ANN202
        found.append(frozen_sensors(self, names, helds))
        return found[-1]
    monkeypatch.setattr(FrozenEncoders, "sensors", spy)
    cached, cached_loss = mcft_run(True, *series)
    assert any(found) and not all(found)   # the first stage has no earlier modality
    monkeypatch.setattr(FrozenEncoders, "sensors", lambda self, names, helds: [])
    plain, plain_loss = mcft_run(True, *series)
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
    earlier round's pass takes that pass's embeddings, and programs that mix such devices
    with others compute only the others; every number of the run is the one a fresh pass
    gives, and the one of other packings (one host per device, whose caches hold one device
    each; one host of all devices, where the devices to compute are not the first of their
    steps)."""
    from raymm.training.lockstep.frozen_cache import FrozenEmbeddingCache, FrozenEncoders

    series = [f"dataset.sensors.{m}.length=32" for m in ("dom", "mid", "weak")]
    programs: list[list[bool]] = []
    lookup, frozen = FrozenEmbeddingCache.lookup, FrozenEncoders.embeddings

    def spy_lookup(self, *a):  # noqa: ANN001, ANN002, ANN202
        found = lookup(self, *a)
        programs[-1].extend(e is not None for e in found)
        return found

    def spy_frozen(self, *a):  # noqa: ANN001, ANN002, ANN202
        programs.append([])
        return frozen(self, *a)
    monkeypatch.setattr(FrozenEmbeddingCache, "lookup", spy_lookup)
    monkeypatch.setattr(FrozenEncoders, "embeddings", spy_frozen)
    kept, kept_loss = mcft_run(True, "rounds=9", *series)
    assert any(all(p) for p in programs if p)           # every device's embeddings kept
    assert any(any(p) and not all(p) for p in programs)  # some kept, some computed
    monkeypatch.setattr(FrozenEmbeddingCache, "lookup",
                        lambda self, sensor, devices, *a: [None] * len(devices))
    fresh, fresh_loss = mcft_run(True, "rounds=9", *series)
    assert kept_loss == fresh_loss
    for g in fresh.server.params:
        assert np.array_equal(kept.server.params[g], fresh.server.params[g]), g
    monkeypatch.setattr(FrozenEmbeddingCache, "lookup", spy_lookup)
    alone, alone_loss = mcft_run(True, "rounds=9", *series, per_host=1)
    assert alone_loss == kept_loss
    for g in fresh.server.params:
        assert np.array_equal(alone.server.params[g], kept.server.params[g]), g
    # one host of every device: devices to compute come after kept ones in a program (not the
    # first k of a step), so their rows and weights are picked by index
    programs.clear()
    together, together_loss = mcft_run(True, "rounds=9", *series, per_host=100)
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
