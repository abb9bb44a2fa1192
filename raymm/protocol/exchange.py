"""What a device exchanges with the server, and which vectors it keeps for that
(`raymm.protocol.device_state.DeviceState.params` and `.base`).

`training.exchange` picks one of three behaviours, all decided here so hosts stay generic:

- ``params`` (default): a selected device loads the server's vectors (its cluster's model when
  the broadcast carries cluster models), trains, and uploads its trained vectors. Nothing is kept.
- ``delta``: a device keeps its own parameters across the rounds of a sync window
  (`DeviceState.params`, dropped once the window's training is sent or a new window starts).
  Training is split into sync windows of ``training.sync_every`` rounds (restarting at every
  schedule phase); at its first selection in a window a device downloads the server's vector
  of the groups it trains (its base, `DeviceState.base`), and if selected in the last round
  (a sync) it uploads the change of each trained group since that base. Between, it trains its
  own parameters and sends nothing. Models change only at syncs, so every delta the server
  receives was computed against a vector the server holds now (its cluster's model, or the
  global one). With
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

from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from raymm.config.schema import Scenario
from raymm.protocol.device_state import DeviceState
from raymm.protocol.messages import Broadcast, RoundPlan

if TYPE_CHECKING:
    from raymm.protocol.seams import Aggregator, Schedule


def sync_window(t: int, sc: Scenario, schedule: Schedule) -> tuple[int, bool]:
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
                  trained: list[str], state: DeviceState, initial: dict[str, np.ndarray]
                  ) -> tuple[dict[str, np.ndarray], DeviceState]:
    """Vectors to load for every travelling group before training, and the device's state with
    any new bases (the input is not changed)."""
    if exchange == "params":
        return {g: bcast.vector(g, device) for g in bcast.params}, state
    if exchange in ("none", "personal"):
        return {g: state.params.get(g, v) for g, v in initial.items()}, state
    # delta: frozen groups are what the device is evaluated with; trained ones are its own
    start = {g: bcast.vector(g, device) for g in bcast.params}
    if plan.downloads(device):
        # a new sync window: whatever an earlier window left (own parameters and bases of
        # this or of an earlier phase's groups) is never read again
        base = {g: bcast.vector(g, device) for g in trained}
        start.update(base)
        return start, replace(state, params={}, base=base)
    for g in trained:
        start[g] = state.params.get(g, initial[g])
    return start, state


def finish(exchange: str, plan: RoundPlan, trained: dict[str, np.ndarray], state: DeviceState,
           initial: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], DeviceState]:
    """(uploads per group, new state) after training: trained vectors, deltas, or nothing."""
    if exchange == "params":
        return trained, state
    params = {**state.params, **trained}
    if exchange in ("none", "personal") or not plan.upload:
        return {}, replace(state, params=params)
    base = dict(state.base)
    uploads = {}
    for g, v in trained.items():
        uploads[g] = (v - base.get(g, initial[g])).astype(np.float32)
        # synced: the device downloads at its next selection (a new window), so neither its
        # parameters nor their base are read again; dropping them bounds what devices keep
        # to the devices inside the current window
        del params[g]
        base.pop(g, None)
    return uploads, replace(state, params=params, base=base)


def eval_vectors(exchange: str, payload: Broadcast, device: int, state: DeviceState,
                 initial: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The model a device is evaluated with: its own (Local, personal), else the server's (its
    cluster's model once clustered, the global/consensus vector otherwise)."""
    if exchange in ("none", "personal"):
        return {g: state.params.get(g, v) for g, v in initial.items()}
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
