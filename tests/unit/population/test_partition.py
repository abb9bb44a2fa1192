"""How the training samples are split over devices (raymm.population.partition): Dirichlet
label skew, the top-up rule, the grouped partition of the clustered benchmark (each device
one group's samples, the group in devices.parquet), and the seeded per-device 80/20 split."""

import numpy as np
import pytest

from raymm.config.schema import PartitionSpec, PopulationSpec
from raymm.data import load_dataset
from raymm.driver.summary import devices_table
from raymm.errors import ScenarioError
from raymm.population.devices import build_population
from raymm.population.partition import device_groups, dirichlet_partition, local_split

PARAMS = {"n_train": 1200, "n_test": 40, "classes": 8}


@pytest.fixture(scope="module")
def grouped():
    return load_dataset("synthetic", {**PARAMS, "groups": 4}, 3)


def test_grouped_partition_gives_each_device_one_group(grouped):
    spec = PopulationSpec(devices=10, partition=PartitionSpec(kind="grouped", alpha=1.0,
                                                              min_samples=20))
    pop = build_population(spec, grouped, 0)
    assert pop.data_group.tolist() == device_groups(10, 4).tolist() == \
        [0, 0, 0, 1, 1, 2, 2, 2, 3, 3]
    for d in range(pop.n):
        assert (grouped.train.group[pop.indices(d)] == pop.data_group[d]).all()
        assert pop.indices(d).shape[0] >= 20
    held = np.concatenate([pop.indices(d) for d in range(pop.n)])
    assert np.unique(held).shape[0] == held.shape[0] == 1200   # every sample, once
    again = build_population(spec, grouped, 0)
    assert np.array_equal(pop.data_indices, again.data_indices)
    assert devices_table(pop).column("group").to_pylist() == pop.data_group.tolist()


def test_grouped_partition_needs_groups():
    plain = load_dataset("synthetic", PARAMS, 3)
    spec = PopulationSpec(devices=4, partition=PartitionSpec(kind="grouped"))
    with pytest.raises(ScenarioError, match="grouped needs a dataset with groups"):
        build_population(spec, plain, 0)


def test_other_partitions_record_no_group(grouped):
    pop = build_population(PopulationSpec(devices=4), grouped, 0)
    assert pop.data_group is None
    assert "group" not in devices_table(pop).column_names


@pytest.fixture(scope="module")
def ds():
    return load_dataset("synthetic", {"n_train": 2000, "n_test": 10, "classes": 6}, 3)


def test_dirichlet_partition_covers_every_sample_once(ds):
    rng = np.random.default_rng(0)
    parts = dirichlet_partition(ds.train.y, 50, 0.5, 5, rng)
    allidx = np.concatenate(parts)
    assert sorted(allidx.tolist()) == list(range(len(ds.train)))
    assert min(p.shape[0] for p in parts) >= 5


def test_small_alpha_skews_labels(ds):
    def mean_classes(alpha):
        parts = dirichlet_partition(ds.train.y, 20, alpha, 2, np.random.default_rng(1))
        return np.mean([np.unique(ds.train.y[p]).shape[0] for p in parts])
    assert mean_classes(0.1) < mean_classes(100.0)
    assert mean_classes(100.0) == 6


def _top_up_by_scanning(owner, n_devices, min_samples, rng):
    """The rule, stated plainly: per needy device in id order, move a uniformly drawn sample
    (in index order) of the currently largest device (lowest id on ties) until it has enough."""
    counts = np.bincount(owner, minlength=n_devices)
    for dev in np.flatnonzero(counts < min_samples):
        while counts[dev] < min_samples:
            donor = int(np.argmax(counts))
            pool = np.flatnonzero(owner == donor)
            owner[pool[rng.integers(pool.shape[0])]] = dev
            counts[donor] -= 1
            counts[dev] += 1


def test_top_up_follows_the_rule_without_scanning_every_sample():
    from raymm.population.partition import _top_up

    rng = np.random.default_rng(3)
    for _ in range(300):
        n, low = int(rng.integers(2, 80)), int(rng.integers(1, 8))
        total = n * low + int(rng.integers(0, 4 * n))
        weights = rng.dirichlet(np.full(n, rng.choice([0.05, 0.5, 5.0])))
        owner = np.minimum(np.searchsorted(np.cumsum(weights), rng.random(total)), n - 1)
        seed = int(rng.integers(1 << 30))
        ours, plain = owner.copy(), owner.copy()
        _top_up(ours, n, low, np.random.default_rng(seed))
        _top_up_by_scanning(plain, n, low, np.random.default_rng(seed))
        assert np.array_equal(ours, plain)
        assert np.bincount(ours, minlength=n).min() >= low


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
