import numpy as np

from raymm.config.schema import AvailabilitySpec, PopulationSpec, TierSpec
from raymm.data import load_dataset
from raymm.population.devices import build_population
from raymm.protocol.observations import Observations


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


def test_server_observations_hold_no_clock():
    fields = set(Observations.__dataclass_fields__)
    assert not fields & {"period", "phase", "online_len", "pattern"}
