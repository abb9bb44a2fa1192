"""Device traces (raymm.population.traces): FLASH's JSON, FedScale's pickles (read without
pickle.load: a class inside is refused), raymm's own CSV/Parquet table, the seeded mapping of
devices onto entries, `raymm data prepare flash-trace|fedscale-trace`, and the real FLASH file
when $RAYMM_DATA has it."""

from __future__ import annotations

import json
import pickle
from collections import OrderedDict

import numpy as np
import pytest

from raymm.errors import DataError
from raymm.population.availability import TraceAvailability
from raymm.population.traces import (
    build_trace,
    load_fedscale,
    load_flash,
    load_raymm,
    map_devices,
    safe_unpickle,
    write_raymm,
)

from helpers import tiny_scenario
from needs import full_data

FLASH = {
    "0": {"isSuccess": True, "trace_start": 1000.0, "trace_end": 2000.0,
          "ready_time": [[1100.0, 1200.0], [1500.0, 1550.0]]},
    "1": {"isSuccess": False, "trace_start": None, "trace_end": None, "ready_time": []},
    "2": {"isSuccess": True, "trace_start": 900.0, "trace_end": 1900.0,
          "ready_time": [[900.0, 950.0]]},
}
BEHAVE = {
    1: {"duration": 600.0, "inactive": [100.0, 400.0], "finish_time": 600.0,
        "active": [0.0, 300.0]},
    2: {"duration": 500.0, "inactive": [250.0], "finish_time": 500.0, "active": [200.0]},
}
CAPACITY = {1: {"computation": 20.0, "communication": 5000.0},
            2: {"computation": 80.0, "communication": 1000.0}}


def test_flash_fixture(tmp_path):
    path = tmp_path / "flash.json"
    path.write_text(json.dumps(FLASH))
    tr = load_flash(path)
    assert tr.names == ("0", "2")  # the device without a trace is left out
    assert tr.origin == 900.0
    np.testing.assert_array_equal(tr.intervals(0), [[1100, 1200], [1500, 1550]])
    av = TraceAvailability(tr, np.array([0, 1], np.int32))
    # simulated second s is instant 900 + s on the common axis
    np.testing.assert_array_equal(av.available(250.0), [True, False])
    np.testing.assert_array_equal(av.departure(250.0), [300.0, 250.0])
    # entry 1's window [900, 1900) repeats: its interval again at 1000 s
    np.testing.assert_array_equal(av.next_arrival(250.0), [250.0, 1000.0])


def test_fedscale_pickles(tmp_path):
    (tmp_path / "behave").write_bytes(pickle.dumps(BEHAVE))
    (tmp_path / "cap").write_bytes(pickle.dumps(CAPACITY))
    tr = load_fedscale(tmp_path / "behave", tmp_path / "cap")
    assert tr.names == ("1", "2")
    np.testing.assert_array_equal(tr.intervals(0), [[0, 100], [300, 400]])
    np.testing.assert_array_equal(tr.window_end, [600.0, 500.0])
    # computation is ms per sample: the faster client gets the larger factor (median = 50)
    np.testing.assert_allclose(tr.speed, [50 / 20, 50 / 80])
    np.testing.assert_allclose(tr.up_mbps, [5.0, 1.0])
    av = TraceAvailability(tr, np.array([0, 1], np.int32))
    # FedScale's windows start at 0 and repeat with period finish_time
    np.testing.assert_array_equal(av.available(650.0), [True, False])
    np.testing.assert_array_equal(av.available(720.0), [False, True])


class Evil:
    def __reduce__(self):  # what a hostile pickle does: call something on load
        return (print, ("pwned",))


def test_unpickler_refuses_classes(tmp_path, capsys):
    # builtins.print, or whatever a library (Ray's tqdm) put in its place in this process
    with pytest.raises(DataError, match=r"refused to load [\w.]*print"):
        safe_unpickle(pickle.dumps({1: Evil()}), "x")
    assert "pwned" not in capsys.readouterr().out
    with pytest.raises(DataError, match="refused to load collections.OrderedDict"):
        safe_unpickle(pickle.dumps(OrderedDict(a=1)), "x")
    with pytest.raises(DataError, match="refused"):
        safe_unpickle(pickle.dumps(np.float64(1.0)), "x")
    (tmp_path / "b").write_bytes(pickle.dumps({1: Evil()}))
    with pytest.raises(DataError):
        load_fedscale(tmp_path / "b")
    assert safe_unpickle(pickle.dumps({"a": [1, 2.5, "x", None, True, (1, 2)]})) == \
        {"a": [1, 2.5, "x", None, True, (1, 2)]}


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_raymm_table_round_trip(tmp_path, suffix):
    tr = build_trace(["a", "b", "c"], [[(0, 10), (20, 30.5)], [], [(5, 6)]],
                     [(0, 40), (0, 40), (0, 100)], speed=[1.5, np.nan, 0.5],
                     up_mbps=[1, 2, 3], down_mbps=[4, 5, 6])
    back = load_raymm(write_raymm(tr, tmp_path / f"t{suffix}"))
    assert back.names == tr.names
    for f in ("offsets", "starts", "ends", "window_start", "window_end", "speed", "up_mbps",
              "down_mbps"):
        np.testing.assert_array_equal(getattr(back, f), getattr(tr, f))


def test_raymm_table_minimal_and_bad(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("device,start,end\nx,0,10\ny,5,20\nx,12,15\nx,9,11\n")
    tr = load_raymm(p)
    assert tr.names == ("x", "y")
    np.testing.assert_array_equal(tr.intervals(0), [[0, 11], [12, 15]])  # merged
    np.testing.assert_array_equal(tr.window_start, [0, 0])  # one common window
    np.testing.assert_array_equal(tr.window_end, [20, 20])
    p.write_text("device,begin,end\nx,0,10\n")
    with pytest.raises(DataError, match="missing column.*start.*unknown column.*begin"):
        load_raymm(p)
    p.write_text("device,start,end\nx,10,0\n")
    with pytest.raises(DataError, match="ends before it starts"):
        load_raymm(p)
    p.write_text("device,start,end,speed\nx,0,1,1\nx,2,3,2\n")
    with pytest.raises(DataError, match="speed differs"):
        load_raymm(p)


def test_mapping_is_seeded_and_replaces_only_beyond_the_trace():
    tr = build_trace([str(i) for i in range(10)], [[(0, 1)]] * 10)
    a = map_devices(7, tr, seed=3)
    assert np.array_equal(a, map_devices(7, tr, seed=3))
    assert len(set(a.tolist())) == 7  # distinct while it fits
    b = map_devices(1000, tr, seed=3)
    assert set(b.tolist()) == set(range(10))
    assert not np.array_equal(a, map_devices(7, tr, seed=4))


def test_prepare_cli(tmp_path, monkeypatch, capsys):
    from raymm.app.cli import main

    (tmp_path / "flash_state_traces.json").write_text(json.dumps(FLASH))
    (tmp_path / "behave").write_bytes(pickle.dumps(BEHAVE))
    (tmp_path / "cap").write_bytes(pickle.dumps(CAPACITY))
    monkeypatch.setenv("RAYMM_DATA", str(tmp_path))
    assert main(["data", "prepare", "flash-trace"]) == 0
    assert load_raymm(tmp_path / "traces" / "flash.parquet").names == ("0", "2")
    assert main(["data", "prepare", "fedscale-trace", "--from", str(tmp_path / "behave"),
                 "--capacity", str(tmp_path / "cap"), "--out", "fs.csv"]) == 0
    np.testing.assert_allclose(load_raymm(tmp_path / "fs.csv").speed, [2.5, 0.625])
    assert main(["data", "prepare", "flash-trace"]) == 2  # exists: --force replaces it
    assert "--force" in capsys.readouterr().err


def test_real_flash_trace():
    root = full_data("flash_state_traces.json")
    tr = load_flash(root / "flash_state_traces.json")
    assert tr.entries == 710
    # whole days: a window repeated before or after itself keeps the time of day (docs/time.md)
    assert (np.mod(tr.span, 86400.0) == 0).all()
    share = tr.online_share()
    assert 0.03 < float(np.median(share)) < 0.08 and float(share.max()) <= 0.79
    av = TraceAvailability(tr, map_devices(2000, tr, seed=0))
    hours = np.arange(0, 7 * 24) * 3600.0
    online = np.array([av.available(s).sum() for s in hours])
    assert 0 < online.mean() < 2000 * 0.2  # a few percent of devices at a time
    dep = av.departure(3600.0 * 30)
    on = av.available(3600.0 * 30)
    assert (dep[on] > 3600.0 * 30).all()


def test_validate_names_a_bad_trace(tmp_path):
    from raymm.app.build import load_scenario
    from raymm.errors import ScenarioError

    bad = tiny_scenario(**{"population.trace": {"path": str(tmp_path / "none.csv"),
                                                "capacity": "x.pkl"}})
    with pytest.raises(ScenarioError) as err:
        load_scenario(bad)
    text = str(err.value)
    assert "population.trace.path: trace file not found" in text
    assert "only format: fedscale has a capacity file" in text


def test_before_its_window_a_device_reads_the_window_a_period_later():
    """The rule for a window that starts after simulated second 0: the window repeats with its
    period in both directions, so before w0 a device is where it is one period later (FLASH's
    windows are whole days: the same time of day). Entry 'late' is observed over [500, 1500)
    and online in [1100, 1200); entry 'early' sets the common axis' origin at 0."""
    tr = build_trace(["early", "late"], [[(0, 10)], [(1100, 1200)]], [(0, 1000), (500, 1500)])
    av = TraceAvailability(tr, np.array([1], np.int32))
    # second 100 is read one period later, at 1100: online, until 200 (as 1100 until 1200)
    assert av.available(100.0)[0] and av.available(1100.0)[0]
    assert av.departure(100.0)[0] == 200.0
    assert not av.available(50.0)[0] and av.next_arrival(50.0)[0] == 100.0
    assert not av.available(250.0)[0] and av.next_arrival(250.0)[0] == 1100.0
    for s in np.arange(0.0, 500.0, 7.3):  # the same as one period later
        assert av.available(s)[0] == av.available(s + 1000.0)[0], s
