"""The worked examples of docs/adding-a-policy.md (policies/examples/): the aggregator of
deltas that clips, and the adaptive proximal term that travels as an extra, each by hand and
in a tiny run. (The guide's other examples are tested where they live:
policies/selection/test_fair.py, policies/aggregation/test_trimmed_mean.py.)"""

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from policies.examples.adaptive_prox import MU, AdaptiveProx, AdaptiveProxParams
from policies.examples.clipped_delta import ClippedDeltaMean, ClippedDeltaParams
from raymm.app.api import RunResult, run
from raymm.app.build import load_scenario
from raymm.driver import checkpoint
from raymm.errors import ScenarioError
from raymm.protocol.messages import HostResult, UpdateBatch, merge_results
from raymm.protocol.seams import AggregationContext

from helpers import tiny_scenario


def batch_of(rows: np.ndarray, samples: list[int]) -> UpdateBatch:
    n = len(samples)
    return merge_results([HostResult(np.arange(n), np.array(samples), np.zeros(n), np.zeros(n),
                                     {"g": rows.astype(np.float32)}, {"g": np.arange(n)})])


def test_clipped_delta_mean_by_hand():
    # norms 5 and 1: the first is scaled to norm 2 ([1.2, 1.6]); weights 1 and 3
    rows = np.array([[3.0, 4.0], [0.0, 1.0]])
    agg = ClippedDeltaMean(ClippedDeltaParams(max_norm=2.0))
    out = agg.aggregate({"g": np.ones(2, np.float32), "h": np.zeros(1, np.float32)},
                        batch_of(rows, [1, 3]), AggregationContext(1, ("a",), None, 0))
    np.testing.assert_allclose(out["g"], [1 + 1.2 / 4, 1 + (1.6 + 3.0) / 4], rtol=1e-6)
    assert out["h"].tolist() == [0.0]  # nobody sent h: unchanged
    assert agg.round_stats() == {"clipped_share": 0.5}


def test_adaptive_prox_by_hand():
    # mean [1, 0]; spread = (1 + 1) / 2 = 1; step = ||[1, 0] - [1, 1]||² = 1 -> µ = 0.1 · 1
    agg = AdaptiveProx(AdaptiveProxParams(mu=0.1, max_mu=1.0))
    assert agg.extras(1)[MU].tolist() == [np.float32(0.1)]  # the first round sends `mu`
    out = agg.aggregate({"g": np.ones(2, np.float32)}, batch_of(np.array([[0.0, 0], [2, 0]]),
                                                                [5, 5]),
                        AggregationContext(1, ("a",), None, 0))
    assert out["g"].tolist() == [1.0, 0.0] and agg.mu == pytest.approx(0.1)
    capped = AdaptiveProx(AdaptiveProxParams(mu=0.1, max_mu=0.05))
    capped.load_state_dict(agg.state_dict())
    assert capped.extras(2)[MU].tolist() == [np.float32(0.1)]  # restored, not recomputed


def tiny_run(tmp_path: Path, **kw: Any) -> RunResult:
    return run(load_scenario(tiny_scenario(rounds=4, **kw)), out=tmp_path)


def rounds_table(res: RunResult) -> pd.DataFrame:
    return pd.read_parquet(res.run_dir / "rounds.parquet")


def test_clipped_delta_mean_in_a_run(tmp_path: Path):
    """Clipping bounds each round's step; without clipping it is the mean of the deltas."""
    delta = {"training.exchange": "delta", "output.checkpoint_every": 1,
             "output.keep_checkpoints": 4}
    tight = tiny_run(tmp_path, aggregation={"name": "clipped_delta_mean", "max_norm": 1e-3},
                     **delta)
    assert (rounds_table(tight)["clipped_share"] == 1.0).all()
    moved = []
    for t in (2, 3, 4):  # every group's step from round t-1 to t is at most max_norm
        before = checkpoint.read(checkpoint.path_of(tight.run_dir, t - 1)).server["params"]
        after = checkpoint.read(checkpoint.path_of(tight.run_dir, t)).server["params"]
        for g in after:
            step = float(np.linalg.norm(np.asarray(after[g], np.float64) - before[g]))
            assert step <= 1e-3 * (1 + 1e-4), (t, g, step)
            moved.append(step)
    assert max(moved) > 0.5e-3
    loose = tiny_run(tmp_path, aggregation={"name": "clipped_delta_mean", "max_norm": 1e6},
                     **delta)
    assert (rounds_table(loose)["clipped_share"] == 0.0).all()
    mean = tiny_run(tmp_path, aggregation={"name": "delta_mean"}, **delta)
    for g in mean.params:
        np.testing.assert_allclose(loose.params[g], mean.params[g], rtol=1e-5, atol=1e-6)


def steps(res: RunResult) -> float:
    """How far the global model moved in rounds 2-4 (from the per-round checkpoints)."""
    params = [checkpoint.read(checkpoint.path_of(res.run_dir, t)).server["params"]
              for t in (1, 2, 3, 4)]
    return sum(float(np.linalg.norm(np.asarray(b[g], np.float64) - a[g]))
               for a, b in zip(params, params[1:]) for g in a)


def test_adaptive_prox_reaches_the_devices(tmp_path: Path):
    """µ travels every round (4 bytes per selected device) and the devices' loss uses it:
    µ = 0 trains as plain FedAvg, a large µ holds the devices near the model they got."""
    every = {"output.checkpoint_every": 1, "output.keep_checkpoints": 4}
    zero = tiny_run(tmp_path, aggregation={"name": "adaptive_prox", "mu": 0.0, "max_mu": 0.0},
                    objective={"name": "adaptive_prox"}, **every)
    plain = tiny_run(tmp_path, aggregation={"name": "fedavg"}, objective={"name": "ce"})
    extra = rounds_table(zero)["bytes_down"] - rounds_table(plain)["bytes_down"]
    assert (extra == 4 * rounds_table(zero)["selected"]).all()
    for g in plain.params:
        np.testing.assert_allclose(zero.params[g], plain.params[g], rtol=1e-5, atol=1e-6)
    # lr 0.05 · µ 10: each local step pulls half way back to the received model (of the 2-3
    # steps a device takes here, the first is a plain step: the model moves ~40% less)
    strong = tiny_run(tmp_path, aggregation={"name": "adaptive_prox", "mu": 10.0,
                                             "max_mu": 10.0},
                      objective={"name": "adaptive_prox"}, **every)
    assert (rounds_table(strong)["prox_mu_next"] > 1.0).all()
    assert steps(strong) < 0.75 * steps(zero)


def test_adaptive_prox_objective_needs_its_aggregator():
    with pytest.raises(ScenarioError, match="adaptive_prox reads µ from the broadcast"):
        load_scenario(tiny_scenario(objective={"name": "adaptive_prox"}))
