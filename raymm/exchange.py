"""What a device keeps between rounds and what it exchanges with the server.

`training.exchange` picks one of three behaviours, all decided here so hosts stay generic:

- ``params`` (default): a selected device loads the server's vectors (its cluster's model when
  the broadcast carries cluster models), trains, and uploads its trained vectors. Nothing is kept.
- ``delta``: a device keeps its own parameters across rounds (state ``params/<g>``). Training is
  split into sync windows of ``training.sync_every`` rounds (restarting at every schedule phase);
  a device selected in the first round of a window downloads the server's vector of the groups
  it trains, one selected in the last round (a sync) uploads the change of each trained group
  since its base (state ``base/<g>``: what it last downloaded, or where it last uploaded, so no
  progress is sent twice). Between, it trains its own parameters and sends nothing. With
  ``sync_every: 1`` every round downloads and uploads (ordinary per-round aggregation of deltas).
- ``none``: the Local baseline. A device trains and evaluates only its own parameters; it
  never downloads or uploads.

A device that has no kept vector for a group uses the initial model, which every process builds
identically from the seed (the one model every device starts from).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from raymm.messages import Broadcast, RoundPlan

PARAMS = "params/"
BASE = "base/"


def sync_flags(t: int, sc: Any, schedule: Any) -> tuple[bool, bool]:
    """(download, upload) for round t. Windows restart at each phase of the schedule
    (`schedule.phase_span(t) -> (first, last)` when it has one); the last round of a phase and
    of the run is always a sync, so no phase ends with unsent training."""
    tr = sc.training
    if tr.exchange == "none":
        return False, False
    if tr.exchange == "params":
        return True, True
    span = getattr(schedule, "phase_span", None)
    first, last = span(t) if span is not None else (1, sc.rounds)
    pos = t - first
    return pos % tr.sync_every == 0, (pos + 1) % tr.sync_every == 0 or t in (last, sc.rounds)


def start_vectors(exchange: str, plan: RoundPlan, bcast: Broadcast, device: int,
                  trained: list[str], state: dict[str, np.ndarray],
                  initial: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray],
                                                         dict[str, np.ndarray]]:
    """Vectors to load for every travelling group before training, and the device's state with
    any new bases (the inputs are not mutated)."""
    if exchange == "params":
        return {g: bcast.vector(g, device) for g in bcast.params}, state
    st = dict(state)
    start = {g: st.get(PARAMS + g, v) for g, v in initial.items()}
    if exchange == "delta" and plan.download:
        for g in trained:
            start[g] = st[BASE + g] = bcast.vector(g, device)
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
    if exchange == "none" or not plan.upload:
        return {}, st
    uploads = {}
    for g, v in trained.items():
        uploads[g] = (v - st.get(BASE + g, initial[g])).astype(np.float32)
        st[BASE + g] = v
    return uploads, st


def eval_vectors(exchange: str, payload: Broadcast, device: int, state: dict[str, np.ndarray],
                 initial: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The model a device is evaluated with: its own (Local), else the server's (its cluster's
    model once clustered, the global/consensus vector otherwise)."""
    if exchange == "none":
        return {g: state.get(PARAMS + g, v) for g, v in initial.items()}
    return {g: payload.vector(g, device, evaluate=True) for g in payload.params}


def aggregator_problems(exchange: str, aggregator: Any, name: str) -> list[str]:
    """An aggregator (class or instance) of deltas must get deltas, and one of parameters must
    get parameters."""
    takes = bool(getattr(aggregator, "takes_deltas", False))
    if exchange == "delta" and not takes:
        return [f"aggregation.name: {name!r} averages parameters, but training.exchange: delta "
                "uploads deltas; use ssca or delta_mean"]
    if exchange == "params" and takes:
        return [f"aggregation.name: {name!r} needs deltas; set training.exchange: delta"]
    return []
