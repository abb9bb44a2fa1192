import numpy as np
import pytest

from raymm.config.schema import PopulationSpec, TierSpec
from raymm.data import load_dataset
from raymm.errors import ScenarioError
from raymm.population.devices import build_population, split_counts
from raymm.population.partition import dirichlet_partition


@pytest.fixture(scope="module")
def ds():
    return load_dataset("synthetic", {"n_train": 2000, "n_test": 10, "classes": 6}, 3)


def test_split_counts_is_exact():
    assert split_counts(100, [0.2, 0.5, 0.3]).tolist() == [20, 50, 30]
    assert split_counts(10, [1, 1, 1]).tolist() == [4, 3, 3]
    assert split_counts(7, [0.5, 0.5]).sum() == 7


def test_tiers_by_count(ds):
    spec = PopulationSpec(devices=100, tiers=[
        TierSpec(sensors=["a", "b"], count=20), TierSpec(sensors=["a"], count=50),
        TierSpec(sensors=["b"], count=30)])
    pop = build_population(spec, ds, 0)
    assert np.bincount(pop.tier).tolist() == [20, 50, 30]
    assert pop.sensor_mask[pop.tier == 0].all()
    assert pop.sensor_mask[pop.tier == 1].tolist() == [[True, False]] * 50
    assert pop.sensor_mask[pop.tier == 2].tolist() == [[False, True]] * 30
    assert pop.held(int(np.flatnonzero(pop.tier == 2)[0])) == ("b",)


def test_tiers_by_fraction_and_count_mismatch(ds):
    spec = PopulationSpec(devices=10, tiers=[TierSpec(sensors=["a"], fraction=0.25),
                                             TierSpec(sensors=["b"], fraction=0.75)])
    assert np.bincount(build_population(spec, ds, 0).tier).tolist() == [3, 7]
    bad = PopulationSpec(devices=10, tiers=[TierSpec(sensors=["a"], count=3)])
    with pytest.raises(ScenarioError, match="add up to 3"):
        build_population(bad, ds, 0)


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


def test_population_is_deterministic_and_seed_dependent(ds):
    spec = PopulationSpec(devices=40)
    a, b, c = (build_population(spec, ds, s) for s in (5, 5, 6))
    np.testing.assert_array_equal(a.data_indices, b.data_indices)
    np.testing.assert_array_equal(a.phase, b.phase)
    assert not np.array_equal(a.data_indices, c.data_indices)


def test_idle_device_is_small(ds):
    pop = build_population(PopulationSpec(devices=1000, partition={"kind": "iid"}), ds, 0)
    per_device = (pop.nbytes() - 4 * len(ds.train)) / pop.n  # minus the index array itself
    assert per_device < 64


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
