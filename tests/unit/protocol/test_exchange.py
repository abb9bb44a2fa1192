"""Device-side exchange modes: sync windows, downloads, what a device starts from, what it
uploads."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from policies.schedule.chain import ModalityChain
from raymm.protocol import exchange
from raymm.protocol.device_state import EMPTY, DeviceState
from raymm.protocol.exchange import downloads, finish, start_vectors, sync_window
from raymm.protocol.messages import Broadcast, ClusterModels, RoundPlan


def _sc(exchange: str, every: int, rounds: int) -> SimpleNamespace:
    return SimpleNamespace(rounds=rounds, training=SimpleNamespace(exchange=exchange,
                                                                   sync_every=every))


def test_sync_windows_restart_at_each_phase_and_end_with_a_sync() -> None:
    chain = ModalityChain(ModalityChain.Params(chain=["a", "b"]))
    chain.bind(SimpleNamespace(rounds=11, model=SimpleNamespace(fusion="sum_logits")),
               ("a", "b"))
    windows = [sync_window(t, _sc("delta", 3, 11), chain) for t in range(1, 12)]
    # phases: rounds 1-6 (a) and 7-11 (b)
    assert [w for w, _ in windows] == [1, 1, 1, 4, 4, 4, 7, 7, 7, 10, 10]
    assert [t for t, (_, u) in zip(range(1, 12), windows) if u] == [3, 6, 9, 11]
    assert all(sync_window(t, _sc("params", 1, 11), chain) == (t, True) for t in (1, 5))
    assert sync_window(2, _sc("none", 1, 11), chain) == (2, False)


def test_a_device_downloads_at_its_first_selection_in_a_window() -> None:
    # last downloads of three selected devices; the window started at round 4
    last = np.array([4, 2, 0])
    np.testing.assert_array_equal(downloads("delta", last, 4), [False, True, True])
    np.testing.assert_array_equal(downloads("params", last, 4), [True, True, True])
    np.testing.assert_array_equal(downloads("none", last, 4), [False, False, False])
    plan = RoundPlan(5, np.array([3, 8, 9]), ("g",), downloads("delta", last, 4))
    assert [plan.downloads(d) for d in (3, 8, 9)] == [False, True, True]
    assert RoundPlan(5, np.array([3, 8]), ("g",), False).download_mask().tolist() == [False] * 2


INIT = {"g": np.zeros(2, np.float32), "h": np.full(2, 7.0, np.float32)}


def _bcast() -> Broadcast:
    params = {"g": np.array([1, 1], np.float32), "h": np.array([2, 2], np.float32)}
    clusters = ClusterModels({"g": np.array([[10, 10], [20, 20]], np.float32)},
                             {"g": np.array([0, 1])}, {"g": np.array([False, True])})
    return Broadcast(3, params, {}, clusters)


def test_params_mode_loads_cluster_model_and_uploads_trained_vectors() -> None:
    plan = RoundPlan(3, np.array([1]), ("g",))
    start, st = start_vectors("params", plan, _bcast(), 1, ["g"], EMPTY, INIT)
    assert start["g"].tolist() == [20, 20] and start["h"].tolist() == [2, 2]
    sent, _ = finish("params", plan, {"g": np.array([21, 21], np.float32)}, st, INIT)
    assert sent["g"].tolist() == [21, 21]
    # a device never clustered trains from and evaluates with the consensus (global) vector
    assert _bcast().vector("g", 0).tolist() == [1, 1]


def test_delta_mode_keeps_own_params_and_sends_each_change_once() -> None:
    window_start = RoundPlan(1, np.array([1]), ("g",), download=True, upload=False)
    middle = RoundPlan(2, np.array([1]), ("g",), download=False, upload=False)
    sync = RoundPlan(3, np.array([1]), ("g",), download=False, upload=True)
    start, st = start_vectors("delta", window_start, _bcast(), 1, ["g"], EMPTY, INIT)
    # frozen groups: what the device is evaluated with (the server's), never an own copy
    assert start["g"].tolist() == [20, 20] and start["h"].tolist() == [2, 2]
    sent, st = finish("delta", window_start, {"g": np.array([21, 21], np.float32)}, st, INIT)
    assert sent == {}
    start, st = start_vectors("delta", middle, _bcast(), 1, ["g"], st, INIT)
    assert start["g"].tolist() == [21, 21]                 # its own parameters, no download
    sent, st = finish("delta", sync, {"g": np.array([23, 23], np.float32)}, st, INIT)
    assert sent["g"].tolist() == [3, 3]                    # since the download at [20, 20]
    assert st.is_empty()     # sent: neither the parameters nor their base are read again
    # the next window: its first selection downloads again, so the next delta is against it
    start, st = start_vectors("delta", window_start, _bcast(), 1, ["g"], st, INIT)
    assert start["g"].tolist() == [20, 20] and st.base["g"].tolist() == [20, 20]


def test_a_new_window_drops_what_earlier_windows_left() -> None:
    """A device not selected at a sync keeps its unsent parameters until its next selection,
    which opens a new window (download): then every earlier group's parameters and bases go,
    an earlier phase's included, and other kept state (e.g. control variates) stays."""
    first = RoundPlan(1, np.array([1]), ("h",), download=True, upload=False)
    kept = DeviceState(objective={"scaffold_ci/h": np.ones(2, np.float32)})
    _, st = start_vectors("delta", first, _bcast(), 1, ["h"], kept, INIT)
    _, st = finish("delta", first, {"h": np.array([5, 5], np.float32)}, st, INIT)
    assert (set(st.params), set(st.base), set(st.objective)) == ({"h"}, {"h"}, {"scaffold_ci/h"})
    next_phase = RoundPlan(9, np.array([1]), ("g",), download=True, upload=False)
    start, st = start_vectors("delta", next_phase, _bcast(), 1, ["g"], st, INIT)
    assert (set(st.params), set(st.base), set(st.objective)) == (set(), {"g"}, {"scaffold_ci/h"})
    assert start["h"].tolist() == [2, 2]


def test_none_mode_never_communicates() -> None:
    plan = RoundPlan(1, np.array([0]), ("g", "h"), download=False, upload=False)
    start, st = start_vectors("none", plan, _bcast(), 0, ["g", "h"], EMPTY, INIT)
    assert start["g"].tolist() == [0, 0]
    sent, st = finish("none", plan, {"g": np.array([5, 5], np.float32),
                                     "h": np.array([6, 6], np.float32)}, st, INIT)
    assert sent == {} and st.params["g"].tolist() == [5, 5]


def test_personal_exchange_keeps_parameters_on_the_device() -> None:
    initial = {"g": np.zeros(2, np.float32)}
    own = DeviceState(params={"g": np.array([1.0, 2.0], np.float32)})
    plan = RoundPlan(3, np.array([0]), ("g",))
    bcast = Broadcast(3, {"g": np.full(2, 9.0, np.float32)})
    start, st = exchange.start_vectors("personal", plan, bcast, 0, ["g"], own, initial)
    np.testing.assert_array_equal(start["g"], [1.0, 2.0])          # never the server's
    sent, st = exchange.finish("personal", plan, {"g": np.array([3.0, 3.0], np.float32)},
                               st, initial)
    assert sent == {} and st.params["g"].tolist() == [3.0, 3.0]
    np.testing.assert_array_equal(
        exchange.eval_vectors("personal", bcast, 0, st, initial)["g"], [3.0, 3.0])
    # extras (prototypes) follow delta's windows: a download at the first selection in one
    assert exchange.downloads("personal", np.array([0, 5]), 4).tolist() == [True, False]
