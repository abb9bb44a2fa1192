"""`raymm.app.api.run(on_round=...)` sees every logged row and can stop the run."""

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
