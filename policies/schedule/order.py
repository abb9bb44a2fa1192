"""The adaptive modality order of a chain (`schedule: {name: modality_chain, order: adaptive}`).

FedMChain fixes the chain by hand; here the server picks the modality of each phase at the
phase boundary from what participants report about their own data (docs/methods/adaptive.md).
This module is the pure part, testable on hand-made observations without a run:

- `ModalityState`: what the server knows about each modality at a boundary;
- the decision rules (`ORDER_RULES`), each a small class scoring every modality;
- `AdaptiveOrder`: the bookkeeping between boundaries — reported accuracies, how many training
  rounds of each modality a report reflects, the gain per round of each modality's latest
  phase, and the decisions. Its `state_dict` is all a checkpoint needs.

A report at round r is made *before* that round's training, on the server's vectors, so it
reflects exactly the training rounds whose sync came before r (`sync_of`); gains are measured
per reflected training round, which makes a short probe and a long phase comparable.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

#: phase kind of the opening probe (every modality trained alone, side by side)
PROBE = -1
#: a phase whose modality is not decided yet
UNDECIDED = -2


@dataclass(frozen=True)
class ModalityState:
    """What the server knows about each modality (arrays in sensor order) at a boundary."""

    accuracy: np.ndarray    # latest reported unimodal accuracy; NaN: never reported
    gain_rate: np.ndarray   # accuracy gained per training round in its latest phase; NaN: unknown
    data_share: np.ndarray  # share of the heard-of training samples on devices holding it


class OrderRule(Protocol):
    """Scores every modality; the largest score is trained next (ties: see `pick`)."""

    def scores(self, s: ModalityState) -> np.ndarray: ...


class GainRule:
    """Greedy on the latest observed learning rate, weighted by the data it serves:
    score = gain_rate · data_share. A modality whose gain is unknown scores +inf (never
    trained or measured: explore it first). After the probe, the first phases therefore go to
    the fastest learner first (FedMChain's dominant-first order, found by measurement), and
    revisits go where the accuracy rose fastest the last time the modality trained."""

    def scores(self, s: ModalityState) -> np.ndarray:
        return np.where(np.isnan(s.gain_rate), np.inf, s.gain_rate * s.data_share)


class WeakestRule:
    """Train the branch with the lowest reported unimodal accuracy (never reported = 0): aims
    straight at the modality imbalance (MIR) that chained training is about."""

    def scores(self, s: ModalityState) -> np.ndarray:
        weakest_first: npt.NDArray[np.float64] = -np.nan_to_num(s.accuracy, nan=0.0)
        return weakest_first


ORDER_RULES: dict[str, OrderRule] = {"gain": GainRule(), "weakest": WeakestRule()}


def pick(scores: np.ndarray, s: ModalityState) -> int:
    """Index of the largest score; ties to the lower accuracy (the branch with more room),
    then to the larger data share, then to the earlier sensor."""
    acc = np.nan_to_num(s.accuracy, nan=0.0)
    order = np.lexsort((np.arange(scores.shape[0]), -s.data_share, acc, -scores))
    return int(order[0])


def data_share(sensor_mask: np.ndarray, num_samples: np.ndarray) -> np.ndarray:
    """Per sensor: share of the training samples of devices heard of (num_samples ≥ 0) that sit
    on devices holding it (what the server knows from registration and online reports)."""
    heard = num_samples >= 0
    n = np.where(heard, num_samples, 0).astype(np.float64)
    total = n.sum()
    if total <= 0:
        return np.full(sensor_mask.shape[1], 1.0 / sensor_mask.shape[1])
    share: npt.NDArray[np.float64] = (n[:, None] * sensor_mask).sum(axis=0) / total
    return share


def sync_rounds(rounds: int, is_sync: Sequence[bool]) -> np.ndarray:
    """int [rounds + 1]: for each round u (1-based), the sync that closes its window (the first
    sync at or after u); rounds + 1 where none does (their training is never reflected)."""
    out = np.full(rounds + 2, rounds + 1, np.int64)
    for u in range(rounds, 0, -1):
        out[u] = u if is_sync[u - 1] else out[u + 1]
    return out[: rounds + 1]


class AdaptiveOrder:
    """Decisions and observations of an adaptive chain.

    `kinds[p]` is the modality index of phase p, `PROBE`, or `UNDECIDED`; `spans[p]` its first
    and last round. `sync_of[u]` is the sync closing round u's window (`sync_rounds`).
    """

    def __init__(self, sensors: tuple[str, ...], rule: str, spans: list[tuple[int, int]],
                 probe: bool, sync_of: np.ndarray) -> None:
        self.sensors, self.rule, self.spans, self.sync_of = sensors, rule, spans, sync_of
        m = len(sensors)
        self.kinds = np.full(len(spans), UNDECIDED, np.int64)
        if probe:
            self.kinds[0] = PROBE
        self.accuracy = np.full(m, np.nan)
        self.gain_rate = np.full(m, np.nan)
        # the reference of each modality's gain: its latest report before its current phase
        # began, as (accuracy, training rounds reflected); gains are slopes from there
        self.ref_acc = np.full(m, np.nan)
        self.ref_seen = np.zeros(m, np.int64)
        self.last_seen = np.zeros(m, np.int64)    # training rounds the latest report reflects
        self.scores = np.full((len(spans), m), np.nan)  # the scores behind each decision

    def __setstate__(self, state: dict[str, object]) -> None:
        # a Ray actor unpickles numpy arrays as read-only views of the object store; this
        # state is updated in place
        self.__dict__.update({k: v.copy() if isinstance(v, np.ndarray) else v
                              for k, v in state.items()})

    # --- the phase plan ----------------------------------------------------------------------
    def trained(self, p: int) -> np.ndarray:
        """bool [M]: the modalities phase p trains (all of them in the probe)."""
        k = int(self.kinds[p])
        out = np.zeros(len(self.sensors), bool)
        if k == PROBE:
            out[:] = True
        elif k >= 0:
            out[k] = True
        return out

    def active_rounds(self) -> np.ndarray:
        """bool [rounds + 1, M]: modality m trains in round u (decided phases only)."""
        last = self.spans[-1][1]
        out = np.zeros((last + 1, len(self.sensors)), bool)
        for p, (first, end) in enumerate(self.spans):
            out[first:end + 1] = self.trained(p)
        return out

    def seen(self, r: int) -> np.ndarray:
        """int [M]: training rounds of each modality a report at round r reflects (those whose
        sync came before r)."""
        act = self.active_rounds()
        rounds: npt.NDArray[np.int64] = act[self.sync_of < r].sum(axis=0)
        return rounds

    def preceding(self, p: int) -> np.ndarray:
        """bool [M]: P for phase p — modalities trained in earlier phases after the probe,
        the phase's own modality excluded (the probe trains every branch alone, so it makes
        no modality a predecessor)."""
        out = np.zeros(len(self.sensors), bool)
        for q in range(p):
            if self.kinds[q] >= 0:
                out[self.kinds[q]] = True
        if self.kinds[p] >= 0:
            out[self.kinds[p]] = False
        return out

    def untouched(self, p: int) -> np.ndarray:
        """bool [M]: modalities no phase before p trained (their vectors are still the initial
        ones every device builds from the seed)."""
        out = np.ones(len(self.sensors), bool)
        for q in range(p):
            out &= ~self.trained(q)
        return out

    # --- observing and deciding --------------------------------------------------------------
    def observe(self, r: int, accuracy: np.ndarray) -> None:
        """A report at round r: accuracy [M] (NaN where nobody reported a modality). A modality
        with training reflected since its reference gets a new gain rate, the slope from the
        reference; one without gets a fresher reading of its reference."""
        seen = self.seen(r)
        for m in np.flatnonzero(~np.isnan(accuracy)):
            a = float(accuracy[m])
            if seen[m] > self.ref_seen[m] and not np.isnan(self.ref_acc[m]):
                self.gain_rate[m] = (a - self.ref_acc[m]) / (seen[m] - self.ref_seen[m])
            else:
                self.ref_acc[m], self.ref_seen[m] = a, seen[m]
            self.accuracy[m], self.last_seen[m] = a, seen[m]

    def decide(self, p: int, share: np.ndarray) -> int:
        """Pick phase p's modality (once; later calls return the decision). Until every
        modality has had a phase, only those that have not are candidates (a branch left with
        the probe's few rounds would fail the devices that hold only it); after that, all."""
        if self.kinds[p] != UNDECIDED:
            return int(self.kinds[p])
        state = ModalityState(self.accuracy.copy(), self.gain_rate.copy(), share)
        scores = ORDER_RULES[self.rule].scores(state)
        had = np.zeros(len(self.sensors), bool)
        had[self.kinds[:p][self.kinds[:p] >= 0]] = True
        if not had.all():
            scores = np.where(had, -np.inf, scores)
        m = pick(scores, state)
        self.scores[p] = scores
        self.kinds[p] = m
        # the gain of this phase is the slope from the latest report before it
        self.ref_acc[m], self.ref_seen[m] = self.accuracy[m], self.last_seen[m]
        return m

    # --- checkpoints -------------------------------------------------------------------------
    _STATE = ("kinds", "accuracy", "gain_rate", "ref_acc", "ref_seen", "last_seen", "scores")

    def state_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k).copy() for k in self._STATE}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for k in self._STATE:
            setattr(self, k, np.array(state[k]))
