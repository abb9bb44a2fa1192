"""The data path on real data, on every clone: the `har` and `avdigits` loaders and short runs
read the small real subsets committed in tests/fixtures/data/ (see its README). Where
`$RAYMM_DATA` holds the full files, the fixtures are re-cut from them and compared array by
array, so the README's account of how they were cut stays true (required in CI)."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from raymm.app.api import run
from raymm.data import DATASETS, load_dataset
from raymm.data.base import loader_facts

from helpers import REPO, load_script
from needs import FIXTURES, fixture, full_data

CUT = load_script(FIXTURES / "cut_fixtures.py", "cut_fixtures")
HAR = "har_windows_subset.npz"
AUDIO, IMAGES = "fsdd_audio_subset.npz", "mnist_test_subset.npz"


def test_fixtures_are_the_ones_the_readme_describes():
    readme = (FIXTURES / "README.md").read_text()
    rows = dict(re.findall(r"^\| `(\w+\.npz)` \| [\d,]+ \| .*\| `([0-9a-f]{16})` \|$", readme,
                           flags=re.M))
    assert set(rows) == set(CUT.SOURCES)
    for name, digest in rows.items():
        assert CUT.content_digest(CUT.read(fixture(name))) == digest, name
    total = sum((FIXTURES / n).stat().st_size for n in rows)
    assert total < 4 * 2**20  # a few MB at most: they live in every clone


def test_har_loader_reads_the_real_subset():
    path = fixture(HAR)
    ds = load_dataset("har", {"path": str(path)}, seed=0)
    assert (len(ds.train), len(ds.test)) == (144, 96)          # 3 and 2 subjects x 6 x 8
    assert ds.num_classes == 6 and ds.class_names[0] == "WALKING"
    assert ds.sensor_shape("acc") == (128, 3) == ds.sensor_shape("gyro")
    assert np.bincount(ds.train.y).tolist() == [24] * 6
    assert np.bincount(ds.test.y).tolist() == [16] * 6
    assert set(ds.train.group.tolist()) == {1, 3, 5} and set(ds.test.group.tolist()) == {2, 4}
    # standardised per channel with the training split's statistics only
    for s in ("acc", "gyro"):
        np.testing.assert_allclose(ds.train.x[s].mean(axis=(0, 1)), 0, atol=1e-5)
        np.testing.assert_allclose(ds.train.x[s].std(axis=(0, 1)), 1, atol=1e-4)
    raw = load_dataset("har", {"path": str(path), "standardize": False}, seed=0)
    with np.load(path) as z:
        assert np.array_equal(raw.train.x["acc"], z["train_acc"])
        # 50% overlap: the second half of a window is the first half of the next one
        same_run = (z["train_exp"][1:] == z["train_exp"][:-1]) & \
            (z["train_start"][1:] - z["train_start"][:-1] == 64)
        i = int(np.flatnonzero(same_run)[0])
        assert np.array_equal(z["train_acc"][i, 64:], z["train_acc"][i + 1, :64])
    loader = DATASETS["har"]
    facts = loader_facts(loader, loader.Params(path=str(path)))
    assert facts is not None and (facts.n_train, facts.groups) == (144, 3)


def test_avdigits_loader_pairs_real_clips_with_real_images():
    params = {"audio_path": str(fixture(AUDIO)), "image_path": str(fixture(IMAGES)),
              "n_fft": 128, "hop": 64}
    ds = load_dataset("avdigits", params, seed=0)
    assert ds.sensors == ("audio", "visual") and ds.num_classes == 10
    assert (len(ds.train), len(ds.test)) == (60, 20)            # take 0 is a test take
    assert ds.sensor_shape("audio") == (126, 65) and ds.sensor_shape("visual") == (28, 28)
    assert abs(float(ds.train.x["audio"].mean())) < 1e-3       # standardised on train
    with np.load(fixture(IMAGES)) as im:
        flat = im["x"].reshape(len(im["y"]), -1).astype(np.float32) / 255
        labels = im["y"]
    for i in range(len(ds.train)):                             # every pair shows one digit
        j = np.flatnonzero((flat == ds.train.x["visual"][i].reshape(-1)).all(axis=1))
        assert j.size and (labels[j] == ds.train.y[i]).all()
    other = load_dataset("avdigits", params, seed=1)
    assert np.array_equal(other.train.x["audio"], ds.train.x["audio"])
    assert not np.array_equal(other.train.x["visual"], ds.train.x["visual"])
    masked = load_dataset("avdigits", {**params, "freq_mask": 5}, seed=0)
    xb = {"audio": torch.ones(2, 126, 65), "visual": torch.ones(2, 28, 28)}
    assert masked.augment is not None
    out = masked.augment(xb, ("audio",), torch.Generator().manual_seed(0))
    assert (out["audio"] == 0).any() and (xb["audio"] == 1).all()


def test_a_short_har_run_on_the_real_subset(tmp_path):
    """The shipped HAR scenario, end to end (load, partition, 1-D CNNs, FedAvg, evaluation),
    on the subset: 6 devices in its three tiers instead of 100."""
    tiers = ("[{sensors: [acc, gyro], count: 2}, {sensors: [acc], count: 2}, "
             "{sensors: [gyro], count: 2}]")
    res = run(REPO / "scenarios" / "har_fedavg.yaml",
              [f"dataset.path={fixture(HAR)}", "population.devices=6",
               f"population.tiers={tiers}", "population.partition.min_samples=8",
               "selection.k=3", "rounds=2", "eval.every=2", "output.tensorboard=false"],
              out=tmp_path, executor="serial")
    s = res.summary
    assert s["rounds_completed"] == 2 and s["devices"] == 6
    assert 0.0 <= s["final_accuracy"] <= 1.0


@pytest.mark.data
@pytest.mark.parametrize("name", sorted(CUT.SOURCES))
def test_fixtures_are_cut_from_the_full_files(name):
    root = full_data(CUT.SOURCES[name])
    again = CUT.CUTTERS[name](root / CUT.SOURCES[name])
    committed = CUT.read(fixture(name))
    assert sorted(again) == sorted(committed)
    for key, arr in again.items():
        assert arr.dtype == committed[key].dtype and np.array_equal(arr, committed[key]), key
