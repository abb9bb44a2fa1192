"""scikit-learn's digits as two sensors (raymm.data.digits): shapes, classes, split, the image
halves, determinism."""

from __future__ import annotations

import numpy as np

from raymm.data import load_dataset

from helpers import assert_identical_datasets


def test_digits_shapes_classes_and_split() -> None:
    ds = load_dataset("digits", {}, seed=0)
    assert ds.sensors == ("left", "right") and ds.num_classes == 10
    assert ds.class_names == tuple(str(c) for c in range(10))
    assert len(ds.train) + len(ds.test) == 1797
    assert abs(len(ds.test) / 1797 - 0.25) < 0.01
    for split in (ds.train, ds.test):
        assert split.y.dtype == np.int64 and set(np.unique(split.y)) == set(range(10))
        for s in ds.sensors:
            x = split.x[s]
            assert x.dtype == np.float32 and x.shape == (len(split), 32)
            assert x.min() >= 0.0 and x.max() <= 1.0
    # stratified: every class holds ~25% of its samples in test
    for c in range(10):
        n_te, n_tr = (ds.test.y == c).sum(), (ds.train.y == c).sum()
        assert abs(n_te / (n_te + n_tr) - 0.25) < 0.02


def test_digits_views_are_image_halves() -> None:
    from sklearn.datasets import load_digits

    ds = load_dataset("digits", {"test_fraction": 0.5}, seed=3)
    images = load_digits().images / 16.0
    left, right = ds.train.x["left"], ds.train.x["right"]
    assert not np.array_equal(left, right)
    # each train row is some image's left half, and the right half of that same image
    flat_left = images[:, :, :4].reshape(-1, 32).astype(np.float32)
    row = int(np.flatnonzero((flat_left == left[0]).all(1))[0])
    np.testing.assert_array_equal(images[row, :, 4:].reshape(32).astype(np.float32), right[0])


def test_digits_deterministic_per_seed() -> None:
    a, b = load_dataset("digits", {}, 7), load_dataset("digits", {}, 7)
    assert_identical_datasets(a, b)
    c = load_dataset("digits", {}, 8)
    assert not np.array_equal(a.test.y, c.test.y) or not np.array_equal(
        a.test.x["left"], c.test.x["left"]
    )
