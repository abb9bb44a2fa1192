"""Asynchronous aggregation on a simulated clock (raymm.sim.async_loop): the event order, the
books in a checkpoint, and whole FedBuff and FedAsync runs on the serial executor (same seed,
same numbers; a run resumed with updates in flight ends where an uninterrupted one does). The
server steps' arithmetic: policies/aggregation/test_fedbuff.py and test_fedasync.py."""

import numpy as np
import pandas as pd
import pytest

from raymm.app.api import run
from raymm.app.build import load_scenario
from raymm.driver.checkpoint import load, path_of, read
from raymm.errors import ScenarioError
from raymm.io import statefile
from raymm.sim.async_loop import WAKE, AsyncBook, Flight, Result
from raymm.sim.serial import SerialExecutor

from helpers import async_scenario, resume_from_round_3, tiny_scenario


def table(run_dir):
    return pd.read_parquet(run_dir / "rounds.parquet").drop(columns=["wall_seconds"])


def assert_same_run(a, b):
    for g in a.params:
        assert np.array_equal(a.params[g], b.params[g]), g
    pd.testing.assert_frame_equal(table(a.run_dir), table(b.run_dir), check_exact=True)


# --- the books ---------------------------------------------------------------------------------
def test_events_in_time_order_ties_by_device_id():
    book = AsyncBook(flight={5: Flight(0, 0.0, 10.0, np.inf, 1, 1),
                             2: Flight(0, 0.0, 10.0, np.inf, 1, 1),
                             9: Flight(0, 0.0, 30.0, 4.0, 1, 1)},   # leaves at 4 s
                     wakes=[12.0])
    import heapq
    h = book.heap()
    assert [heapq.heappop(h) for _ in range(4)] == [(4.0, 9), (10.0, 2), (10.0, 5), (12.0, WAKE)]


def test_book_survives_a_checkpoint_file(tmp_path):
    res = Result({"g": np.arange(3, dtype=np.float32)}, 0.5, 12, 3.0, False)
    book = AsyncBook(clock=17.5, version=4, batches=6, decisions=9,
                     flight={3: Flight(4, 12.0, 40.0, np.inf, 100, 50),
                             1: Flight(3, 10.0, 50.0, 20.0, 100, 50)},
                     pending={3}, results={7: res}, buffer=[(8, 2, res)],
                     bases={2: {"g": np.ones(3, np.float32)}, 4: {"g": np.zeros(3, np.float32)}},
                     wakes=[99.0], since={"arrivals": 2.0}, dispatched=[3, 1],
                     totals={"arrivals": 11.0}, stale_counts=np.array([3, 2]))
    path = tmp_path / "book.safetensors"
    path.write_bytes(statefile.to_bytes(book.state_dict(), "test"))
    state, _ = statefile.read(path, "test")
    back = AsyncBook.from_state(state)
    assert back.heap() == book.heap()
    assert back.flight == book.flight and back.pending == {3} and back.wakes == [99.0]
    assert back.results[7].rows["g"].tolist() == [0, 1, 2] and back.buffer[0][:2] == (8, 2)
    assert sorted(back.bases) == [2, 4] and back.stale_counts.tolist() == [3, 2]
    assert (back.clock, back.version, back.batches, back.decisions) == (17.5, 4, 6, 9)


def test_async_refuses_what_it_cannot_run():
    with pytest.raises(ScenarioError, match="buffer"):
        load_scenario(async_scenario(aggregation={"name": "fedbuff", "concurrency": 2,
                                                  "buffer": 3}))
    with pytest.raises(ScenarioError, match="exchange"):
        load_scenario(async_scenario(**{"training.exchange": "delta"}))
    with pytest.raises(ScenarioError, match="all_online"):
        load_scenario(async_scenario(selection={"name": "all_online"}))
    with pytest.raises(ScenarioError, match="seconds clock"):
        load_scenario(async_scenario(**{"clock.mode": "rounds"}))


# --- whole runs --------------------------------------------------------------------------------
def test_fedbuff_run_keeps_its_rules(tmp_path, monkeypatch):
    calls = []
    real = SerialExecutor.train_now

    def counting(self, plan, bcast):
        calls.append(plan.selected.size)
        return real(self, plan, bcast)

    monkeypatch.setattr(SerialExecutor, "train_now", counting)
    a = run(async_scenario(), out=tmp_path / "a")
    df = table(a.run_dir)
    assert df["round"].tolist() == list(range(1, 8))
    assert (df["participated"] == 3).all()                       # a step every M arrivals
    assert (df["async/in_flight"] <= 6).all()
    assert df["async/staleness_max"].max() >= 1                  # stale updates happen
    assert df["departed"].sum() >= 1                       # and devices leave
    assert df["sim_seconds_total"].is_monotonic_increasing
    assert 0 < df["wasted_share"].iloc[-1] < 1
    assert max(calls) > 1                                        # devices train in batches
    s = a.summary["async"]
    assert s["arrivals"] == 21 and sum(s["staleness_counts"]) == 21
    assert df["accuracy"].notna().sum() == 4
    b = run(async_scenario(), out=tmp_path / "b")                # same seed, same numbers
    assert_same_run(a, b)


@pytest.mark.parametrize("method", ["fedbuff", "fedasync"])
def test_resume_with_updates_in_flight_is_exact(tmp_path, method):
    ref = run(async_scenario(method), out=tmp_path)
    ck = load(ref.run_dir)
    assert ck.round == 6
    first = sorted((ref.run_dir / "checkpoints").glob("*.safetensors"))[0]
    at3 = read(first).server["async"]
    assert len(at3["flight"]["ids"]) > 0                         # updates were in flight
    res = resume_from_round_3(tmp_path, ref)
    assert res.summary["rounds_completed"] == 7
    assert_same_run(ref, res)


def test_the_scenarios_selector_fills_the_slots(tmp_path):
    """TIDE's score picks who fills a free slot (k = the free slots), among the available
    devices not in flight."""
    r = run(async_scenario(selection={"name": "tide", "k": 5}, rounds=4), out=tmp_path)
    df = table(r.run_dir)
    assert (df["participated"] == 3).all() and (df["async/in_flight"] <= 6).all()


def test_free_slots_wait_for_devices_to_come_online(tmp_path):
    """C = every device: slots of devices offline stay free until availability changes (a
    wake-up event, kept in the checkpoint), and the resumed run is still exact."""
    agg = {"name": "fedbuff", "concurrency": 12, "buffer": 3}
    ref = run(async_scenario(aggregation=agg), out=tmp_path)
    df = table(ref.run_dir)
    assert (df["async/in_flight"] < 12).any()
    assert df["sim_seconds_total"].iloc[-1] > 60  # past the first availability slot
    assert_same_run(ref, resume_from_round_3(tmp_path, ref))


def lockstep_fleet(n, **kw):
    """n devices that are always online, hold the same number of samples and compute equally
    fast: every update sent at one instant arrives at one instant."""
    return tiny_scenario(**{
        "population.devices": n, "clock.mode": "seconds",
        "population.tiers": [{"sensors": ["a", "b"], "count": n}],
        "population.availability": [{"pattern": "always", "fraction": 1.0}],
        "population.partition": {"kind": "iid"},          # 400 samples, split evenly
        "population.hardware": [{"gflops": 3e-6}],        # no jitter: equal speeds
        "selection": {"name": "random", "k": n}, **kw})


def test_fedbuff_with_m_equal_c_is_fedavg_round_for_round(tmp_path):
    """FedBuff with M = C = every device, η = 1, equal speeds and everyone always online runs
    synchronous FedAvg's rounds: all C updates of an instant arrive before any slot is
    refilled, so each version is trained from the previous one by the same cohort. Equal up
    to rounding: FedBuff adds the weighted mean float32 delta to x, FedAvg averages the
    vectors."""
    n, rounds = 4, 5
    same = {"rounds": rounds, "output.checkpoint_every": 1, "output.keep_checkpoints": rounds}
    buff = run(lockstep_fleet(n, method="fedbuff", **same, aggregation={
        "name": "fedbuff", "concurrency": n, "buffer": n, "server_lr": 1.0}),
        out=tmp_path / "fedbuff")
    avg = run(lockstep_fleet(n, method="fedavg", **same), out=tmp_path / "fedavg")
    for t in range(1, rounds + 1):
        a = read(path_of(buff.run_dir, t)).server["params"]
        b = read(path_of(avg.run_dir, t)).server["params"]
        for g in b:
            assert np.allclose(a[g], b[g], rtol=0, atol=1e-6), (t, g)
    fb, fa = table(buff.run_dir), table(avg.run_dir)
    assert (fb["async/staleness_max"] == 0).all() and (fb["participated"] == n).all()
    assert np.allclose(fb["sim_seconds_total"], fa["sim_seconds_total"])
    assert np.allclose(fb["train_loss"], fa["train_loss"], rtol=1e-6)
    # the parameters did move: not two runs standing still
    first = read(path_of(avg.run_dir, 1)).server["params"]
    assert any(not np.allclose(first[g], avg.params[g], atol=1e-3) for g in first)


def test_steps_within_one_instant_refill_after_the_last(tmp_path):
    """C = 4, M = 2, equal speeds: the four updates of an instant make two versions, the second
    from updates one version stale; the slots refill once, from the newest version, after the
    instant's last event. A checkpoint between the two steps of one instant resumes exactly."""
    ref = run(lockstep_fleet(4, method="fedbuff", rounds=7, **{"output.checkpoint_every": 3},
                             aggregation={"name": "fedbuff", "concurrency": 4, "buffer": 2}),
              out=tmp_path)
    df = table(ref.run_dir)
    assert df["async/staleness_max"].tolist() == [0, 1, 0, 1, 0, 1, 0]
    assert df["async/in_flight"].tolist() == [2, 4, 2, 4, 2, 4, 2]
    t = df["sim_seconds_total"].to_numpy()
    assert t[0] == t[1] and t[2] == t[3] and t[1] < t[2]
    assert_same_run(ref, resume_from_round_3(tmp_path, ref))    # round 3: mid-instant
