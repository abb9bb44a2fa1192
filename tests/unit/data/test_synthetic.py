"""The synthetic generator (raymm.data.synthetic): shapes, balance, determinism, independent
sensor streams, signal strength, its parameters; and label groups that conflict on every
class (the clustered benchmark's data)."""

import numpy as np
import pytest
from pydantic import ValidationError

from raymm.data import DATASETS, Dataset, dataset_params, load_dataset
from raymm.data.synthetic import group_labels

from helpers import assert_identical_datasets

PARAMS = {"n_train": 1200, "n_test": 40, "classes": 8}


def test_groups_disagree_on_every_class():
    y = np.arange(8)
    labels = [group_labels(y, np.full(8, g), 8, 4) for g in range(4)]
    for g in range(4):
        assert sorted(labels[g].tolist()) == list(range(8))   # a permutation
        for h in range(g):
            assert (labels[g] != labels[h]).all()


def test_groups_keep_the_inputs_and_shift_the_labels():
    grouped = load_dataset("synthetic", {**PARAMS, "groups": 4}, 3)
    plain = load_dataset("synthetic", PARAMS, 3)
    assert plain.train.group is None
    for m in plain.sensors:
        assert np.array_equal(plain.train.x[m], grouped.train.x[m])
    g = grouped.train.group
    assert set(np.unique(g).tolist()) == {0, 1, 2, 3}
    assert np.array_equal(grouped.train.y, (plain.train.y + 2 * g) % 8)


def test_more_groups_than_classes_is_refused():
    with pytest.raises(Exception, match="groups"):
        load_dataset("synthetic", {**PARAMS, "groups": 9}, 0)


def nearest_mean_accuracy(ds: Dataset, sensor: str) -> float:
    """Test accuracy of the closest train class mean: a cheap separability probe."""
    xtr = ds.train.x[sensor].reshape(len(ds.train), -1)
    xte = ds.test.x[sensor].reshape(len(ds.test), -1)
    means = np.stack([xtr[ds.train.y == c].mean(axis=0) for c in range(ds.num_classes)])
    dist = ((xte[:, None, :] - means[None]) ** 2).sum(-1)
    return float((dist.argmin(1) == ds.test.y).mean())


def test_synthetic_defaults_shapes_and_balance() -> None:
    params = dataset_params("synthetic", {})
    assert DATASETS["synthetic"].sensors(params) == ("a", "b")
    ds = load_dataset("synthetic", params, seed=0)
    assert ds.num_classes == 6 and (len(ds.train), len(ds.test)) == (2000, 500)
    assert ds.sensor_shape("a") == (16,) and ds.train.x["b"].dtype == np.float32
    assert ds.train.y.dtype == np.int64
    counts = np.bincount(ds.train.y, minlength=6)
    assert counts.max() - counts.min() <= 1


def test_synthetic_time_series_shape() -> None:
    raw = {
        "classes": 4,
        "n_train": 40,
        "n_test": 12,
        "sensors": {
            "ts": {"dim": 3, "informativeness": 1.0, "length": 50},
            "v": {"dim": 5, "informativeness": 0.5},
        },
    }
    ds = load_dataset("synthetic", raw, seed=1)
    assert ds.train.x["ts"].shape == (40, 50, 3) and ds.test.x["ts"].shape == (12, 50, 3)
    assert ds.train.x["v"].shape == (40, 5)
    assert ds.train.x["ts"].dtype == np.float32


def test_synthetic_deterministic_and_sensor_streams_independent() -> None:
    base = {"sensors": {"a": {"dim": 4, "informativeness": 1.0}}, "n_train": 50, "n_test": 20}
    a, b = load_dataset("synthetic", base, 5), load_dataset("synthetic", base, 5)
    assert_identical_datasets(a, b)
    assert not np.array_equal(a.train.x["a"], load_dataset("synthetic", base, 6).train.x["a"])
    more = {**base, "sensors": {"z": {"dim": 2, "informativeness": 0.0}, **base["sensors"]}}
    c = load_dataset("synthetic", more, 5)
    # adding a sensor leaves the other sensors' arrays untouched
    assert c.train.x["a"].tobytes() == a.train.x["a"].tobytes()


@pytest.mark.parametrize("length", [None, 32])
def test_synthetic_informativeness_controls_separability(length: int | None) -> None:
    sensors = {
        "strong": {"dim": 16, "informativeness": 1.0, "length": length},
        "noise": {"dim": 16, "informativeness": 0.0, "length": length},
    }
    raw = {"classes": 6, "n_train": 1200, "n_test": 600, "sensors": sensors}
    ds = load_dataset("synthetic", raw, 0)
    assert nearest_mean_accuracy(ds, "strong") > 0.9
    assert nearest_mean_accuracy(ds, "noise") < 1 / 6 + 0.08


def test_synthetic_params_validation() -> None:
    with pytest.raises(ValidationError):
        dataset_params("synthetic", {"classes": 3, "bogus": 1})
    with pytest.raises(ValidationError):
        dataset_params("synthetic", {"sensors": {"a": {"dim": 0, "informativeness": 1.0}}})
    with pytest.raises(ValidationError):
        dataset_params("synthetic", {"sensors": {"a": {"dim": 2, "informativeness": -1.0}}})
    with pytest.raises(KeyError):
        dataset_params("no-such-dataset", {})
