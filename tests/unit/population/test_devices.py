"""The simulated devices (raymm.population.devices): tiers by count and fraction, the
availability patterns and their clock, determinism, the size of an idle device."""

import numpy as np
import pytest

from raymm.config.schema import AvailabilitySpec, PopulationSpec, TierSpec
from raymm.data import load_dataset
from raymm.errors import ScenarioError
from raymm.population.devices import build_population, split_counts


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


def _pop(availability, n=30, seed=0):
    ds = load_dataset("synthetic", {"n_train": 1000, "n_test": 10}, seed)
    spec = PopulationSpec(devices=n, availability=availability,
                          tiers=[TierSpec(sensors=["a"], fraction=0.5),
                                 TierSpec(sensors=["a", "b"], fraction=0.5)])
    return build_population(spec, ds, seed)


def test_clock_formula_by_hand():
    pop = _pop([AvailabilitySpec(pattern="custom", period=5, online=2)])
    i = 3
    D, d, phi = int(pop.period[i]), int(pop.online_len[i]), int(pop.phase[i])
    assert (D, d) == (5, 2) and 0 <= phi < 5
    expected = [((t + phi) % D) < d for t in range(20)]
    got = [bool(pop.online(t, np.array([i]))[0]) for t in range(20)]
    assert got == expected
    assert sum(got) == 8  # 2 of every 5 rounds, over 4 periods


def test_named_patterns_and_phases():
    pop = _pop([AvailabilitySpec(pattern="business_hours", fraction=0.5),
                AvailabilitySpec(pattern="overnight", fraction=0.5)], n=200)
    assert set(zip(pop.period.tolist(), pop.online_len.tolist())) == {(60, 40), (40, 20)}
    assert (pop.phase < pop.period).all() and (pop.phase >= 0).all()
    # phases differ across devices, so devices of one pattern are not synchronised
    assert len(np.unique(pop.phase[pop.period == 60])) > 10
    online_share = np.mean([pop.online(t) for t in range(120)], axis=0)
    np.testing.assert_allclose(online_share[pop.period == 60], 40 / 60)
    np.testing.assert_allclose(online_share[pop.period == 40], 20 / 40)


def test_always_is_always_online():
    pop = _pop([AvailabilitySpec(pattern="always")])
    assert all(pop.online(t).all() for t in range(10))


def test_patterns_assigned_independently_of_sensors():
    av = [AvailabilitySpec(pattern="overnight", fraction=0.3),
          AvailabilitySpec(pattern="always", fraction=0.7)]
    ds = load_dataset("synthetic", {"n_train": 300, "n_test": 10}, 0)
    a = build_population(PopulationSpec(devices=30, availability=av), ds, 0)
    b = build_population(PopulationSpec(devices=30, availability=av, tiers=[
        TierSpec(sensors=["a"], count=10), TierSpec(sensors=["b"], count=20)]), ds, 0)
    # changing the tiers does not move anyone's availability
    np.testing.assert_array_equal(a.pattern, b.pattern)
    np.testing.assert_array_equal(a.phase, b.phase)
