"""tools/cluster_model.py: the round-time model's fit and its sizing arithmetic."""


import pytest

from helpers import REPO, load_script


def cluster_model():
    return load_script(REPO / "tools" / "cluster_model.py")


def test_fit_recovers_the_constants_of_times_the_model_made():
    cm = cluster_model()
    true = {"a": 0.05, "b": 3e-5, "c": 4e-4}

    def one_actor_run(k, slower=0.0):
        return {"k": k, "actor_cpu": 0.01 + true["c"] * k, "rest_cpu": 0.02 + true["b"] * k,
                "fastest": cm.predict(true, k, 1) + slower}

    # the CPU slopes give b and c whatever outside load did to the wall times
    got = cm.fit([one_actor_run(1000, 0.3), one_actor_run(500, 0.2), one_actor_run(10)])
    assert got == pytest.approx(true, rel=1e-9)
    assert cm.predict(got, 4000, 8) == pytest.approx(0.05 + 3e-5 * 4000 + 4e-4 * 500)


def test_actors_needed_meets_the_target_or_says_it_cannot():
    cm = cluster_model()
    m = {"a": 0.1, "b": 1e-5, "c": 1e-3}
    need = cm.actors_needed(m, 10_000, 1.0, 0.0)            # room 0.8 s for 10 s of training
    assert need == 13 and cm.predict(m, 10_000, need) <= 1.0 < cm.predict(m, 10_000, need - 1)
    assert cm.actors_needed(m, 100_000, 1.0, 0.0) is None   # b*K alone is 1 s
    assert cm.actors_needed(m, 100, 10.0, 0.0) == 1
    # a population-wide cost per round eats into the room: 0.5 s at a million devices
    assert cm.actors_needed({**m, "e": 5e-7}, 10_000, 1.0, 0.0, 10**6) == 34


def test_transfer_counts_one_vector_per_block_holding_a_selected_device():
    cm = cluster_model()
    # every one of the 4 blocks of N=1024 is hit when all devices are selected
    assert cm.transfer_s(1, 1024, 1024, 1000, 8.0) == pytest.approx(
        (4 * 1000 + 4 * 8 * 1000) * 8 / 8e9)
    # few picks out of many blocks: about one block per pick
    few = cm.transfer_s(0, 10, 10**6, 1000, 8.0)
    assert 9.8 * 8000 * 8 / 8e9 < few < 10 * 8000 * 8 / 8e9
