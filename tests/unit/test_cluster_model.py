"""scenarios/bench/cluster_model.py: the round-time model's fit and its sizing arithmetic."""

import importlib.util

import pytest

from helpers import REPO


def cluster_model():
    spec = importlib.util.spec_from_file_location(
        "cluster_model", REPO / "scenarios" / "bench" / "cluster_model.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_fit_recovers_the_constants_of_times_the_model_made():
    cm = cluster_model()
    k = 1000
    # one DeviceActor: 0.4 ms of CPU per device plus 10 ms once per round; beside it 40 ms
    # per round and 30 us per device
    dev = (0.010 + 4e-4 * k, 0.010 + 4e-4 * k / 2)
    rest = (0.040 + 3e-5 * k, 0.040 + 3e-5 * k / 2)
    got = cm.fit(k, dev, rest)
    assert got == pytest.approx({"a": 0.050, "b": 3e-5, "c": 4e-4}, rel=1e-9)
    assert cm.predict(got, k, 1) == pytest.approx(dev[0] + rest[0])
    assert cm.predict(got, 4000, 8) == pytest.approx(0.05 + 3e-5 * 4000 + 4e-4 * 500)


def test_actors_needed_meets_the_target_or_says_it_cannot():
    cm = cluster_model()
    m = {"a": 0.1, "b": 1e-5, "c": 1e-3}
    need = cm.actors_needed(m, 10_000, 1.0, 0.0)            # room 0.8 s for 10 s of training
    assert need == 13 and cm.predict(m, 10_000, need) <= 1.0 < cm.predict(m, 10_000, need - 1)
    assert cm.actors_needed(m, 100_000, 1.0, 0.0) is None   # b*K alone is 1 s


def test_transfer_counts_one_vector_per_block_holding_a_selected_device():
    cm = cluster_model()
    # every one of the 4 blocks of N=1024 is hit when all devices are selected
    assert cm.transfer_s(1, 1024, 1024, 1000, 8.0) == pytest.approx(
        (4 * 1000 + 4 * 8 * 1000) * 8 / 8e9)
    # few picks out of many blocks: about one block per pick
    few = cm.transfer_s(0, 10, 10**6, 1000, 8.0)
    assert 9.8 * 8000 * 8 / 8e9 < few < 10 * 8000 * 8 / 8e9
