"""`raymm.run` (raymm.app.api): the per-round hook `on_round` sees every logged row and can
stop the run."""

import pandas as pd

from raymm.app.api import run

from helpers import tiny_scenario


def test_hook_sees_every_round(tmp_path):
    seen = []
    res = run(tiny_scenario(rounds=3), out=tmp_path, on_round=lambda row: seen.append(row["round"]))
    assert seen == [1, 2, 3] and [r["round"] for r in res.rows] == seen


def test_hook_returning_true_stops_after_that_round(tmp_path):
    res = run(tiny_scenario(rounds=5), out=tmp_path, on_round=lambda row: row["round"] == 2)
    assert [r["round"] for r in res.rows] == [1, 2]
    assert res.summary["rounds_completed"] == 2


def test_on_round_sees_each_row_and_can_stop(tmp_path):
    """docs/running.md's example of `on_round`: follow the curve, stop at a target."""
    curve, seen = [], []

    def watch(row):
        seen.append(row["round"])
        acc = row.get("accuracy")
        row["accuracy"] = -1.0          # the hook's copy: the run's table does not change
        if acc is not None:
            curve.append((row["round"], acc))
        return row["round"] == 3

    res = run(tiny_scenario(rounds=6, **{"eval.every": 2}), out=tmp_path, on_round=watch)
    assert seen == [1, 2, 3]            # stopped after round 3, as early stopping does
    assert res.summary["rounds_completed"] == 3 and res.summary["ended"] == "completed"
    # the hook saw the evaluated round's accuracy; its own change did not reach the table
    assert [t for t, _ in curve] == [2]
    table = pd.read_parquet(res.run_dir / "rounds.parquet").set_index("round")
    assert list(table.index) == [1, 2, 3]
    assert table.loc[2, "accuracy"] == curve[0][1] == res.summary["final_accuracy"]
    assert not (table["accuracy"] == -1.0).any()
