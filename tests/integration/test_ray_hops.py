"""`tools/ray_hops.py`: Ray's hops timed alone, and a scenario's rounds on Ray."""

import pytest
import yaml

from helpers import REPO, load_script, tiny_scenario


def script():
    return load_script(REPO / "tools" / "ray_hops.py")


def test_the_chain_is_timed_hop_by_hop(ray_session):
    s = script()
    # 200 KiB: past Ray's limit for inline results, so they go through the object store
    hops = s.measure(result_kb=200, work_ms=3.0, rounds=3, plan_ms=0.5, agg_ms=0.5)
    assert list(hops) == s.HOPS
    # each hop is a later stamp less an earlier one, taken in another process
    assert all(hops[h] > 0 for h in ["driver->plan", "plan->train", "result->aggregation",
                                     "record->driver"])
    # the round holds the busy loops (plan, training, aggregation) and the hops
    assert hops["round"] > 4.0
    assert hops["hops"] == pytest.approx(hops["round"] - 4.0)


def test_a_scenarios_rounds_are_read_from_rays_timeline(tmp_path, ray_session):
    s = script()
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(tiny_scenario()))
    rows = s.scenario_rounds(str(path), [], 3)
    assert len(rows) == 3
    for row in rows:
        assert list(row) == s.TIMELINE
        assert all(v >= 0 for v in row.values())
        # the parts lie inside the round (the later train to start need not be the longest:
        # their sum is no bound), and Ray's steps inside the task
        assert row["submit->train"] < row["round"] and row["train"] < row["round"]
        assert row["train->aggregation"] + row["aggregation"] + row["aggregation->driver"] \
            < row["round"]
        assert 0 < row["its arguments"] + row["its results"] < row["train"]


@pytest.mark.parametrize("args, says", [(["--rounds", "0"], "at least 1"),
                                        (["--work-ms", "1,x"], "comma-separated"),
                                        (["--result-kb", "-3"], "negative")])
def test_bad_arguments_are_refused_before_ray_starts(args, says, capsys):
    with pytest.raises(SystemExit) as exc:
        script().main(args)
    assert exc.value.code == 2 and says in capsys.readouterr().err
