"""What the clustered study reads: the adjusted Rand index, per-group accuracy, and SSCA's
π = 1 (no merging across clusters)."""

import numpy as np
from sklearn.metrics import adjusted_rand_score

from policies.aggregation.ssca import consistency
from raymm.protocol.messages import DeviceEval
from raymm.server.device_metrics import adjusted_rand_index, cluster_recovery, device_metrics

from helpers import REPO


def test_ari_equals_scikit_learn():
    rng = np.random.default_rng(0)
    for _ in range(20):
        a, b = rng.integers(0, 4, 30), rng.integers(0, 3, 30)
        assert abs(adjusted_rand_index(a, b) - adjusted_rand_score(a, b)) < 1e-12
    a = rng.integers(0, 4, 30)
    assert adjusted_rand_index(a, (a + 1) % 4) == 1.0            # renaming changes nothing
    assert adjusted_rand_index(np.zeros(5), np.zeros(5)) == 1.0


def test_cluster_recovery_reads_the_senders_assignment():
    truth = np.array([0, 0, 1, 1, 2, 2])
    assignment = {"sensor:a": np.array([3, 3, 0, 0, 1, 1]), "sensor:b": np.array([0] * 6)}
    out = cluster_recovery(assignment, {"sensor:a": np.arange(6)}, truth)
    assert out == {"ssca/ari": 1.0}
    out = cluster_recovery(assignment, {"sensor:a": np.arange(6), "sensor:b": np.arange(6)},
                           truth)
    assert out["ssca/ari"] == 0.5
    assert cluster_recovery(assignment, {}, truth) == {}


def test_accuracy_per_group():
    ev = DeviceEval(np.arange(4), np.full(4, 10), np.array([10, 8, 2, 4]), np.zeros(4),
                    np.zeros((4, 1), np.int64), {})
    out = device_metrics([ev], np.zeros(4, np.int64), (("a",),), ("a",),
                         np.array([0, 0, 1, 1]))
    assert out["acc_group/0"] == 0.9 and abs(out["acc_group/1"] - 0.3) < 1e-12
    assert "acc_group/0" not in device_metrics([ev], np.zeros(4, np.int64), (("a",),), ("a",))


def test_pi_one_merges_nothing():
    cons = np.array([[1.0, 2e6, -1.0], [1.0, 3e6, 1.0]])
    _, mu, _ = consistency(cons, 1.0, 1e-12)
    assert not mu.any()
    _, mu, _ = consistency(cons, 0.9, 1e-12)
    assert mu.tolist() == [True, True, False]


def test_reassign_once_keeps_returning_senders_on_their_model():
    from policies.aggregation.ssca import SSCAParams, ssca_step

    rng = np.random.default_rng(1)
    direction = rng.standard_normal((2, 50))
    deltas = np.concatenate([direction[0] + 0.1 * rng.standard_normal((4, 50)),
                             direction[1] + 0.1 * rng.standard_normal((4, 50))])
    models = np.zeros((2, 50), np.float32)
    previous = np.array([1, 1, 0, -1, 0, 0, 1, -1])          # some returning on the "wrong" model
    p = SSCAParams(clusters=2, min_cluster_size=1, reassign="once")
    step = ssca_step(deltas, np.ones(8), models, previous, p, 0)
    kept = previous >= 0
    assert np.array_equal(step.index[kept], previous[kept])
    assert step.index[3] != step.index[7]                    # new senders: by their cluster
    paper = ssca_step(deltas, np.ones(8), models, previous, SSCAParams(
        clusters=2, min_cluster_size=1), 0)
    assert len(set(paper.index[:4].tolist())) == 1 and len(set(paper.index[4:].tolist())) == 1


def test_clustered_run_records_groups_ari_and_per_group_accuracy(tmp_path):
    """A short run of the clustered benchmark: devices.parquet holds each device's group, the
    rows per-group ACC and, at every sync, the ARI of SSCA's clusters."""
    import pandas as pd

    import policies  # noqa: F401  (registers the presets)
    from raymm.app.api import run
    from raymm.config.schema import apply_overrides, read_yaml

    scenario = REPO / "scenarios" / "ssca_clustered.yaml"
    raw = apply_overrides(read_yaml(scenario),
                          ["rounds=4", "training.local_epochs=1", "population.devices=16",
                           "dataset.n_train=1600", "selection.k=16",
                           "aggregation.min_cluster_size=2"])
    res = run(raw, out=tmp_path, executor="serial")
    devices = pd.read_parquet(res.run_dir / "devices.parquet")
    assert devices["group"].tolist() == [g for g in range(4) for _ in range(4)]
    rows = pd.read_parquet(res.run_dir / "rounds.parquet")
    syncs = rows.dropna(subset=["ssca/clusters"])
    assert len(syncs) == 2 and syncs["ssca/ari"].between(-1, 1).all()
    evals = rows.dropna(subset=["accuracy"])
    assert {f"acc_group/{g}" for g in range(4)} <= set(evals.columns)
