"""Pre-summed id blocks: the canonical weighted mean is bit for bit the same for every packing,
whether hosts pre-sum or the server sums rows."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from policies.aggregation.fedavg import FedAvg
from raymm.app.api import run
from raymm.device.host import DeviceHost
from raymm.protocol import combine
from raymm.protocol.combine import weighted_mean

from helpers import tiny_scenario


def test_a_blocks_sums_depend_on_its_own_rows_only():
    """Summed with all the others, or alone: the same bits. For vectors (P > 1) the rows are
    added one by one in id order."""
    rng = np.random.default_rng(0)
    for _ in range(20):
        k, p = int(rng.integers(1, 400)), int(rng.integers(2, 3000))
        ids = np.sort(rng.choice(5000, k, replace=False))
        rows = (rng.normal(size=(k, p)) * rng.uniform(1e-3, 1e3)).astype(np.float32)
        w = rng.integers(1, 100, k).astype(np.float64)
        blocks, sums, weights = combine.block_sums(rows, w, ids)
        assert np.array_equal(blocks, np.unique(ids // combine.BLOCK))
        for b, s, ws in zip(blocks, sums, weights):
            mine = np.flatnonzero(ids // combine.BLOCK == b)
            alone = combine.block_sums(rows[mine], w[mine], ids[mine])
            assert np.array_equal(alone[1][0], s) and alone[2][0] == ws
            acc = np.zeros(p)
            for i in mine:
                acc = acc + rows[i].astype(np.float64) * w[i]
            assert np.array_equal(acc, s)


def test_block_sums_are_numpys_reduce_bit_for_bit():
    """The block sum is the bits of `np.add.reduce` over the block's float64 products --
    signed zeros included, and numpy's own (pairwise) order for a one-element vector."""
    rng = np.random.default_rng(1)
    ids = np.arange(0, 600, 2)                       # blocks of 128 rows
    for p in (1, 7, 4550):
        rows = rng.normal(size=(ids.shape[0], p)).astype(np.float32)
        rows[:, 0] = -0.0                            # a column of negative zeros
        w = rng.integers(1, 100, ids.shape[0]).astype(np.float64)
        _, sums, _ = combine.block_sums(rows, w, ids)
        for j, b in enumerate(np.unique(ids // combine.BLOCK)):
            mine = ids // combine.BLOCK == b
            want = np.add.reduce(np.multiply(rows[mine], w[mine, None], dtype=np.float64),
                                 axis=0)
            assert np.array_equal(sums[j].view(np.int64), want.view(np.int64)), p


@pytest.mark.parametrize("lo,hi,n,expected", [
    (0, 256, 1000, (0, 1)), (0, 255, 1000, (0, 0)), (1, 600, 1000, (1, 2)),
    (512, 1000, 1000, (2, 4)),   # the last, short block [768, 1000) is whole
    (700, 1000, 1000, (3, 4)), (0, 10, 10, (0, 1)), (3, 10, 10, (1, 1))])
def test_complete_blocks(lo, hi, n, expected):
    assert combine.complete_blocks(lo, hi, n) == expected


def test_weighted_mean_by_hand():
    rows = np.array([[1.0, 2.0], [3.0, 6.0]], np.float32)
    assert combine.weighted_mean(rows, np.array([1.0, 3.0]), np.array([4, 900])).tolist() \
        == [2.5, 5.0]
    assert combine.weighted_mean(rows, np.zeros(2), np.array([4, 9])) is None


def test_packing_and_presumming_do_not_change_results(tmp_path, monkeypatch):
    """Blocks of 4 ids over 12 devices: one host pre-sums every block; hosts of 5 or 7 devices
    hold some blocks whole and split others; one device per host sends rows only; and with
    pre-summing switched off the server sums every row. All give the same numbers."""
    monkeypatch.setattr(combine, "BLOCK", 4)
    presummed = []
    original = DeviceHost._presum

    def spy(self, *args):
        out = original(self, *args)
        presummed.append(sum(p.senders.shape[0] for p in out.values()))
        return out

    monkeypatch.setattr(DeviceHost, "_presum", spy)

    def params_and_rows(per_host):
        sc = tiny_scenario(**{"rounds": 3, "selection.k": 10, "training.upload": "held",
                              "execution.devices_per_actor": per_host})
        res = run(sc, out=tmp_path)
        rows = pd.read_parquet(res.run_dir / "rounds.parquet").drop(columns=["wall_seconds"])
        return res.params, rows

    ref, ref_rows = params_and_rows(12)
    assert sum(presummed) > 0
    monkeypatch.setattr(FedAvg, "combinable", False)
    presummed.clear()
    cases = {"rows only": params_and_rows(12)}
    assert sum(presummed) == 0
    monkeypatch.setattr(FedAvg, "combinable", True)
    for per in (5, 7, 1):
        cases[f"{per} per host"] = params_and_rows(per)
    for name, (params, rows) in cases.items():
        pd.testing.assert_frame_equal(rows, ref_rows, check_exact=True, obj=name)
        for g in ref:
            assert np.array_equal(params[g], ref[g]), (name, g)


def test_weighted_mean_of_integer_weights_by_hand():
    rows = np.array([[1.0, 2.0], [3.0, 6.0]], np.float32)
    np.testing.assert_array_equal(weighted_mean(rows, np.array([1, 3]), np.array([4, 9])),
                                  [2.5, 5.0])
