"""What a device keeps between rounds and what it exchanges with the server.

`training.exchange` picks one of three behaviours, all decided here so hosts stay generic:

- ``params`` (default): a selected device loads the server's vectors (its cluster's model when
  the broadcast carries cluster models), trains, and uploads its trained vectors. Nothing is kept.
- ``delta``: a device keeps its own parameters across the rounds of a sync window (state
  ``params/<g>``, dropped once the window's training is sent or a new window starts). Training is
  split into sync windows of ``training.sync_every`` rounds (restarting at every schedule phase);
  at its first selection in a window a device downloads the server's vector of the groups it
  trains (its base, state ``base/<g>``), and if selected in the last round (a sync) it uploads
  the change of each trained group since that base. Between, it trains its own parameters and
  sends nothing. Models change only at syncs, so every delta the server receives was computed
  against a vector the server holds now (its cluster's model, or the global one). With
  ``sync_every: 1`` every round downloads and uploads (ordinary per-round aggregation).
  Groups a device holds but does not train this round (the earlier modalities of a chain, kept
  frozen) are always the server's vectors it is evaluated with, never a stale own copy.
- ``none``: the Local baseline. A device trains and evaluates only its own parameters; it
  never downloads or uploads.
- ``personal``: as ``none``, every device trains and is evaluated with its own parameters, which
  never travel; what travels is the round's extras (e.g. FedProto's prototypes): the server's
  are downloaded and the device's uploaded on the sync windows of ``delta`` (every round with
  ``sync_every: 1``). The aggregator must declare ``personal = True``.

A device that has no kept vector for a group uses the initial model, which every process builds
identically from the seed (the one model every device starts from).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from raymm.messages import Broadcast, RoundPlan

if TYPE_CHECKING:
    from raymm.policy import Aggregator, Schedule

PARAMS = "params/"
BASE = "base/"


def sync_window(t: int, sc: Any, schedule: Schedule) -> tuple[int, bool]:
    """(first round of round t's sync window, whether t is a sync). Windows restart at each
    phase of the schedule (`schedule.phase_span(t) -> (first, last)`, None for one phase); the
    last round of a phase and of the run is always a sync, so no phase ends with unsent training.
    Exchanges other than delta sync every round; Local (none) never does."""
    tr = sc.training
    if tr.exchange == "none":
        return t, False
    if tr.exchange == "params":
        return t, True
    span = schedule.phase_span(t)
    first, last = span if span is not None else (1, sc.rounds)
    pos = t - first
    return t - pos % tr.sync_every, (pos + 1) % tr.sync_every == 0 or t in (last, sc.rounds)


def downloads(exchange: str, last_download: np.ndarray, window_start: int) -> np.ndarray:
    """bool per selected device (given the round each last received its trained groups): it
    receives them now, i.e. every round (params), never (none), or at its first selection in
    the sync window that starts at `window_start` (delta; personal, where only extras travel)."""
    if exchange not in ("delta", "personal"):
        return np.full(last_download.shape, exchange == "params")
    return last_download < window_start


def start_vectors(exchange: str, plan: RoundPlan, bcast: Broadcast, device: int,
                  trained: list[str], state: dict[str, np.ndarray],
                  initial: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray],
                                                         dict[str, np.ndarray]]:
    """Vectors to load for every travelling group before training, and the device's state with
    any new bases (the inputs are not mutated)."""
    if exchange == "params":
        return {g: bcast.vector(g, device) for g in bcast.params}, state
    st = dict(state)
    if exchange in ("none", "personal"):
        return {g: st.get(PARAMS + g, v) for g, v in initial.items()}, st
    # delta: frozen groups are what the device is evaluated with; trained ones are its own
    start = {g: bcast.vector(g, device) for g in bcast.params}
    if plan.downloads(device):
        # a new sync window: whatever an earlier window left (own parameters and bases of
        # this or of an earlier phase's groups) is never read again
        st = {k: v for k, v in st.items() if not k.startswith((PARAMS, BASE))}
        for g in trained:
            start[g] = st[BASE + g] = bcast.vector(g, device)
        return start, st
    for g in trained:
        start[g] = st.get(PARAMS + g, initial[g])
    return start, st


def finish(exchange: str, plan: RoundPlan, trained: dict[str, np.ndarray],
           state: dict[str, np.ndarray], initial: dict[str, np.ndarray]
           ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(uploads per group, new state) after training: trained vectors, deltas, or nothing."""
    if exchange == "params":
        return trained, state
    st = dict(state)
    for g, v in trained.items():
        st[PARAMS + g] = v
    if exchange in ("none", "personal") or not plan.upload:
        return {}, st
    uploads = {}
    for g, v in trained.items():
        uploads[g] = (v - st.get(BASE + g, initial[g])).astype(np.float32)
        # synced: the device downloads at its next selection (a new window), so neither its
        # parameters nor their base are read again; dropping them bounds what devices keep
        # to the devices inside the current window
        del st[PARAMS + g]
        st.pop(BASE + g, None)
    return uploads, st


def eval_vectors(exchange: str, payload: Broadcast, device: int, state: dict[str, np.ndarray],
                 initial: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The model a device is evaluated with: its own (Local, personal), else the server's (its
    cluster's model once clustered, the global/consensus vector otherwise)."""
    if exchange in ("none", "personal"):
        return {g: state.get(PARAMS + g, v) for g, v in initial.items()}
    return {g: payload.vector(g, device) for g in payload.params}


def aggregator_problems(exchange: str, aggregator: Aggregator | type[Aggregator], name: str
                        ) -> list[str]:
    """An aggregator (class or instance) of deltas must get deltas, and one of parameters must
    get parameters."""
    takes, personal = bool(aggregator.takes_deltas), bool(aggregator.personal)
    if (exchange == "personal") != personal:
        return [f"aggregation.name: {name!r} " + (
            "exchanges no parameters: set training.exchange: personal" if personal else
            "merges parameters, but training.exchange: personal never sends any")]
    if exchange == "delta" and not takes:
        return [f"aggregation.name: {name!r} averages parameters, but training.exchange: delta "
                "uploads deltas; use ssca or delta_mean"]
    if exchange == "params" and takes:
        return [f"aggregation.name: {name!r} needs deltas; set training.exchange: delta"]
    return []
