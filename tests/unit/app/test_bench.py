"""`raymm bench` (raymm.app.bench): its options, and a run of both implementations reporting
steady seconds per round side by side, with the arithmetic floor."""

import json
from argparse import Namespace

import pytest

from raymm.app import bench, bench_floor
from raymm.errors import RaymmError


def test_steady_and_sizes():
    assert bench.steady([9.0, 1.0, 3.0]) == 2.0
    assert bench.parse_sizes("1000:100,5000:500") == [(1000, 100), (5000, 500)]


def test_executors_parse_and_bad_ones_are_named():
    assert bench.parse_executors("ray") == ["ray"]
    assert bench.parse_executors("serial, ray,serial") == ["serial", "ray"]
    for bad in ("dask", "ray,gpu", ","):
        with pytest.raises(RaymmError, match="bench --executor"):
            bench.parse_executors(bad)


def test_bench_modes_are_the_training_paths_and_the_old_name_still_reads():
    assert bench.parse_modes("sequential,lockstep") == ["sequential", "lockstep"]
    assert bench.parse_modes("vectorised") == ["lockstep"]
    for bad in ("fast", "lockstep,gpu", ","):
        with pytest.raises(RaymmError, match="bench: --modes"):
            bench.parse_modes(bad)


@pytest.mark.slow
def test_bench_command_reports_both_implementations(tmp_path, capsys):
    args = Namespace(sizes="40:4", rounds=2, seed=0, modes="sequential,lockstep",
                     executor="serial", bare_loop=None, out=tmp_path, overrides=[], repeat=1)
    rows = bench.main(args)
    assert [r["impl"] for r in rows] == ["bare_loop", "raymm sequential", "raymm lockstep"]
    assert rows[0]["ratio"] == 1.0
    for r in rows:
        assert r["steady_s"] > 0 and r["ratio"] == pytest.approx(r["steady_s"] /
                                                                 rows[0]["steady_s"])
        assert len(r["round_seconds"]) in (2, 3) and 0 <= r["final_acc"] <= 1
        # raymm's timed rounds: no device fell back from lock-step training
        assert r.get("fallbacks", [0, 0]) == [0, 0] and r.get("fallbacks_all", [0]) == [0]
    # sequential and lock-step raymm train the same model (to float32 rounding)
    assert rows[1]["final_acc"] == pytest.approx(rows[2]["final_acc"], abs=0.01)
    assert all(r["tree_pss_mb"] > 0 for r in rows)  # raymm's tree is read between rounds
    saved = json.loads((tmp_path / "bench.json").read_text())
    assert len(saved["rows"]) == 3 and saved["meta"]["executor"] == "serial"
    [floor] = saved["floors"]
    assert (floor["N"], floor["K"]) == (40, 4) and floor["seconds"] > 0
    assert floor["ratio"] == pytest.approx(floor["seconds"] / rows[0]["steady_s"])
    assert floor["gflop"] == pytest.approx(bench_floor.round_flops(4, 64, 64, 6, 64, 32, 1) / 1e9)
    out = capsys.readouterr().out
    assert "bare_loop" in out and "arithmetic floor" in out and "N=40 K=4 matrix products" in out
    assert "lock-step fallbacks per round [0, 0]" in out


def test_bench_runs_the_packaged_loop_unless_given_a_script(tmp_path):
    from raymm.errors import RaymmError

    assert bench.bare_command(None)[1:] == ["-m", "raymm.app.bare_loop"]
    script = tmp_path / "other_loop.py"
    assert bench.bare_command(script)[1:] == [str(script)]
    args = bench.build_parser().parse_args(["--bare-loop", str(script)])
    with pytest.raises(RaymmError, match="other_loop.py"):
        bench.main(args)                                      # not there: one clear message
