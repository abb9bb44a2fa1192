"""Per-device 80/20 split, the avdigits loader (real data) and scenario variants."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import policies
from raymm.app.build import load_scenario
from raymm.app.variants import method_variant
from raymm.config.schema import read_yaml
from raymm.population.partition import local_split

from helpers import REPO
from needs import full_data

SCENARIOS = REPO / "scenarios"


def test_local_split_is_seeded_disjoint_and_80_20() -> None:
    parts = [np.arange(0, 10), np.arange(10, 13), np.arange(13, 14)]
    train, test = local_split(parts, 0.2, seed=3)
    assert [t.shape[0] for t in test] == [2, 1, 0]   # round(0.2·n): 2, round(0.6)=1, 0
    for p, a, b in zip(parts, train, test):
        assert np.array_equal(np.sort(np.concatenate([a, b])), p)
        assert np.intersect1d(a, b).size == 0
    again = local_split(parts, 0.2, seed=3)
    assert all(np.array_equal(a, b) for a, b in zip(test, again[1]))
    other = local_split(parts, 0.2, seed=4)[1][0]
    assert not np.array_equal(test[0], other)


def test_method_variant_drops_only_what_the_other_method_cannot_take() -> None:
    raw = read_yaml(SCENARIOS / "fedmchain_synthetic.yaml")
    raw["aggregation"] = {"clusters": 3}
    raw["objective"] = {"tau": 0.2}
    fedavg = method_variant(raw, "fedavg", policies.PRESETS, sync_every=1)
    assert "aggregation" not in fedavg and "objective" not in fedavg
    assert "sync_every" not in fedavg["training"] and fedavg["training"]["lr"] == 0.005
    assert fedavg["selection"]["name"] == "fraction"     # a named section stays
    wo_ra = method_variant(raw, "fedmchain_wo_ra", policies.PRESETS)
    assert wo_ra["aggregation"] == {"clusters": 3} and wo_ra["training"]["sync_every"] == 2
    wo_ssca = method_variant(raw, "fedmchain_wo_ssca", policies.PRESETS)
    assert "aggregation" not in wo_ssca and wo_ssca["objective"] == {"tau": 0.2}
    assert raw["aggregation"] == {"clusters": 3}         # input untouched


def test_method_variant_keeps_the_sync_period_for_every_method() -> None:
    raw = read_yaml(SCENARIOS / "fedmchain_synthetic.yaml")     # sync_every: 2
    fedavg = method_variant(raw, "fedavg", policies.PRESETS)
    assert fedavg["training"]["exchange"] == "delta" and fedavg["training"]["sync_every"] == 2
    assert fedavg["aggregation"] == {"name": "delta_mean"}
    scaffold = method_variant(raw, "scaffold", policies.PRESETS)
    assert scaffold["aggregation"] == {"name": "scaffold_delta"}
    assert "sync_every" not in method_variant(raw, "local", policies.PRESETS)["training"]
    assert method_variant(raw, "fedmchain", policies.PRESETS, sync_every=7)[
        "training"]["sync_every"] == 7
    for method in ("fedavg", "fedprox", "scaffold", "local", "fedmchain"):
        load_scenario(method_variant(raw, method, policies.PRESETS))   # each one is valid


@pytest.mark.data
def test_avdigits_pairs_by_label_with_spectrograms() -> None:
    """On the full files (the subset: tests/unit/test_data_fixtures.py)."""
    from raymm.data import load_dataset

    data = full_data("fsdd_audio_8k.npz", "mnist_test_28x28.npz")
    ds = load_dataset("avdigits", {"n_fft": 128, "hop": 64, "freq_mask": 5}, seed=0)
    assert ds.sensors == ("audio", "visual") and ds.num_classes == 10
    assert len(ds.train) == 2700 and len(ds.test) == 300      # FSDD takes 0-4 held out
    assert ds.sensor_shape("audio") == (126, 65)               # [frames, n_fft/2 + 1 bins]
    assert ds.sensor_shape("visual") == (28, 28)
    assert abs(float(ds.train.x["audio"].mean())) < 1e-3       # standardised on train
    # every pair shows the same digit: the image is an MNIST test image of that label
    mnist = np.load(data / "mnist_test_28x28.npz")
    flat = mnist["x"].reshape(10000, -1).astype(np.float32) / 255
    for i in (0, 1234, 2699):
        j = np.flatnonzero((flat == ds.train.x["visual"][i].reshape(-1)).all(axis=1))
        assert j.size and (mnist["y"][j] == ds.train.y[i]).all()
    # pairing is drawn from the seed; the audio does not depend on it
    other = load_dataset("avdigits", {"n_fft": 128, "hop": 64}, seed=1)
    assert np.array_equal(other.train.x["audio"], ds.train.x["audio"])
    assert not np.array_equal(other.train.x["visual"], ds.train.x["visual"])
    # SpecAugment: zeroes one band of bins per sample, for audio holders only
    xb = {"audio": torch.ones(3, 126, 65), "visual": torch.ones(3, 28, 28)}
    out = ds.augment(xb, ("audio",), torch.Generator().manual_seed(0))
    zero_bins = (out["audio"] == 0).all(dim=1)                 # [B, F]
    for row in zero_bins:
        idx = torch.nonzero(row).flatten()
        assert idx.numel() <= 5 and (idx.numel() == 0 or idx[-1] - idx[0] + 1 == idx.numel())
    assert (xb["audio"] == 1).all()                            # the input is not modified
    assert ds.augment(xb, ("visual",), torch.Generator()) is xb
