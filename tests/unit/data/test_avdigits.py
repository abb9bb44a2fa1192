"""The audio-visual digits (raymm.data.avdigits): the prepared FSDD and MNIST files are what the
loader reads; on the full files, FSDD paired with MNIST by label, as spectrograms and images."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from raymm.data import load_dataset
from raymm.data.prepare import prepare

from needs import full_data
from tiny_releases import FSDD_CLIPS, fsdd_release, mnist_release


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


def test_prepared_fsdd_and_mnist_are_what_avdigits_reads(tmp_path, monkeypatch):
    monkeypatch.setenv("RAYMM_DATA", str(tmp_path))
    prepare("fsdd", fsdd_release(tmp_path / "fsdd"))
    prepare("mnist", mnist_release(tmp_path / "mnist"))
    ds = load_dataset("avdigits", {}, seed=0)  # the default files: fsdd_audio_8k, mnist_test
    assert ds.train.y.shape[0] + ds.test.y.shape[0] == len(FSDD_CLIPS)
    assert ds.test.y.tolist() == [0, 0, 0, 1, 1]  # takes < 5, rows by speaker, digit, take
