"""Modality-chained training (FedMChain's MCFT): one phase per modality, in chain order.

In the phase of modality m only devices holding m are eligible and only the group `sensor:m`
(m's encoder and its classifier) is trained, sent and aggregated; every other branch stays
frozen. Needs late fusion by summed logits (`model.fusion: sum_logits`): with a shared fusion
layer there would be a group no phase trains.

`order: adaptive` (beyond the paper, which names choosing the order as future work): the
phase boundaries are fixed in advance, but the server picks each phase's modality when the
phase starts, from per-modality accuracies participants report on their own training data
(`policies.schedule.order`, docs/methods/adaptive.md). It may open with a short probe in which
every branch trains alone, and it may revisit a modality (more phases than modalities). The
phase's predecessors P_m (the modalities trained in earlier phases) travel to the devices with
the broadcast (`extras()`, counted as traffic), since no device can know them in advance.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from policies.schedule.order import PROBE, UNDECIDED, AdaptiveOrder, data_share, sync_rounds
from raymm.config.schema import Scenario
from raymm.errors import refuse
from raymm.models.network import sensor_group
from raymm.protocol.exchange import sync_window
from raymm.protocol.observations import Observations
from raymm.protocol.registry import SCHEDULES
from raymm.protocol.seams import ModalityReport, Schedule

#: broadcast extra of an adaptive chain: float32 [M], 1 for the modalities in P of the phase
PRECEDING = "chain_preceding"
#: phase name of the adaptive order's opening probe
PROBE_PHASE = "probe"


class ChainParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    #: modality order, e.g. [audio, visual]; None = the dataset's sensor order
    chain: list[str] | None = Field(default=None, min_length=1)
    #: rounds per phase (must add up to the run's rounds, less the probe's); None = an equal
    #: split, the remainder going to the earliest phases
    rounds: list[int] | None = Field(default=None, min_length=1)
    #: fixed: the chain above; adaptive: the server picks each phase's modality when the phase
    #: starts, from the per-modality accuracy participants report (docs/methods/adaptive.md)
    order: Literal["fixed", "adaptive"] = "fixed"
    #: adaptive: phases after the probe; more than the modalities revisits some; None = the
    #: number of modalities + 1
    phases: int | None = Field(default=None, ge=1)
    #: rounds of an opening probe, in which every branch trains alone on its own loss (with
    #: order: adaptive its reports rank the modalities before the first phase); None = two
    #: sync windows (2·training.sync_every) with order: adaptive, none with a fixed chain;
    #: 0 = no probe. A fixed chain with a probe is the ablation that tells the order's effect
    #: from the probe's
    probe_rounds: int | None = Field(default=None, ge=0)
    #: adaptive: weakest (the lowest reported unimodal accuracy) or gain (the largest accuracy
    #: gain per round in a modality's latest phase, weighted by its data share). weakest is the
    #: default since measured: on the imbalanced audio-visual benchmark it beat every fixed
    #: order by 8 points where gain lost by 8 (docs/methods/adaptive.md, 3 seeds)
    rule: Literal["gain", "weakest"] = "weakest"


def phase_lengths(total: int, phases: int) -> list[int]:
    base, rest = divmod(total, phases)
    return [base + (1 if i < rest else 0) for i in range(phases)]


def resolve_chain(chain: Sequence[str] | None, sensors: tuple[str, ...]) -> tuple[str, ...]:
    """The modality order of a run: the configured `chain`, or the dataset's sensor order."""
    return tuple(chain or sensors)


def preceding(chain: tuple[str, ...], m: str) -> tuple[str, ...]:
    """P_m: the modalities before m in `chain`."""
    return chain[:chain.index(m)]


def probe_length(p: ChainParams, sc: Scenario) -> int:
    """Rounds of the opening probe (by default none for a fixed chain, two sync windows for
    the adaptive order)."""
    if p.probe_rounds is not None:
        return p.probe_rounds
    return 0 if p.order == "fixed" else 2 * int(sc.training.sync_every)


def chain_problems(p: ChainParams, sc: Scenario, sensors: tuple[str, ...]) -> list[str]:
    """Every mistake in a chain's parameters against the run (the same checks for `raymm
    validate` and for a run)."""
    problems = []
    if sc.model.fusion != "sum_logits":
        problems.append("model.fusion: modality_chain needs sum_logits (late fusion)")
    if p.order == "adaptive":
        unused = [k for k in ("chain",) if getattr(p, k) is not None]
        if unused:
            problems.append("schedule.chain: order: adaptive picks the modalities itself; "
                            "drop schedule.chain or set order: fixed")
        probe = probe_length(p, sc)
        phases = p.phases or len(sensors) + 1
        lengths = p.rounds or phase_lengths(max(sc.rounds - probe, 0), phases)
        if probe + phases > sc.rounds:
            problems.append(f"schedule.phases: the probe ({probe} rounds) and {phases} phases of "
                            f"≥ 1 round do not fit in rounds={sc.rounds}; lower "
                            "schedule.phases or schedule.probe_rounds")
        elif len(lengths) != phases or sum(lengths) != sc.rounds - probe or min(lengths) < 1:
            problems.append(f"schedule.rounds: {lengths} must give every one of the {phases} "
                            "phases ≥ 1 round and add up to rounds - probe = "
                            f"{sc.rounds - probe}")
        return problems
    if p.phases is not None:
        problems.append("schedule.phases: only used with order: adaptive")
    if p.rule != type(p).model_fields["rule"].default:
        problems.append("schedule.rule: only used with order: adaptive")
    chain = list(resolve_chain(p.chain, sensors))
    bad = [m for m in chain if m not in sensors]
    if bad:
        problems.append(f"schedule.chain: {bad} not among the dataset's sensors {sensors}")
    if len(set(chain)) != len(chain):
        problems.append(f"schedule.chain: repeats a modality: {chain}")
    probe = probe_length(p, sc)
    lengths = p.rounds or phase_lengths(max(sc.rounds - probe, 0), len(chain))
    if len(lengths) != len(chain) or sum(lengths) != sc.rounds - probe or min(lengths) < 1:
        problems.append(f"schedule.rounds: {lengths} must give every one of the {len(chain)} "
                        f"phases ≥ 1 round and add up to rounds={sc.rounds}"
                        + (f" less the probe's {probe}" if probe else ""))
    return problems


@SCHEDULES.register("modality_chain")
class ModalityChain(Schedule):
    """One modality per phase: a fixed chain, or (`order: adaptive`) the modality the server
    picks at each phase boundary from what participants report; optionally after a probe that
    trains every branch alone."""

    Params = ChainParams

    def __init__(self, params: ChainParams) -> None:
        self.params = params
        self.sensors: tuple[str, ...] = ()
        self.chain: tuple[str, ...] = tuple(params.chain or ())
        self.last = np.zeros(0, np.int64)   # last round of each phase
        self.fixed_kinds = np.zeros(0, np.int64)   # a fixed chain's phases: PROBE or a sensor
        self.adaptive: AdaptiveOrder | None = None
        self._round = 0

    @staticmethod
    def model_needs(params: ChainParams) -> frozenset[str]:
        return frozenset({"sensor_groups", "logit_fusion"})

    @staticmethod
    def check_scenario(params: ChainParams, scenario: Scenario,
                       sensors: tuple[str, ...] | None) -> list[str]:
        return [] if sensors is None else chain_problems(params, scenario, sensors)

    def bind(self, sc: Scenario, sensors: tuple[str, ...]) -> None:
        """Resolve the chain (or the adaptive plan) and the phase boundaries against the run
        (raises ScenarioError)."""
        refuse(chain_problems(self.params, sc, sensors))
        self.sensors = tuple(sensors)
        p = self.params
        probe = probe_length(p, sc)
        if p.order == "fixed":
            self.chain = resolve_chain(p.chain, sensors)
            lengths = list(p.rounds or phase_lengths(sc.rounds - probe, len(self.chain)))
            self.fixed_kinds = np.array([PROBE] * bool(probe) + [
                self.sensors.index(m) for m in self.chain], np.int64)
        else:
            phases = p.phases or len(sensors) + 1
            lengths = list(p.rounds or phase_lengths(sc.rounds - probe, phases))
        lengths = [probe] * bool(probe) + lengths
        self.last = np.cumsum(lengths).astype(np.int64)
        if p.order == "adaptive":
            spans = [(self.first_round(i), int(self.last[i])) for i in range(len(lengths))]
            syncs = [sync_window(t, sc, self)[1] for t in range(1, sc.rounds + 1)]
            self.adaptive = AdaptiveOrder(self.sensors, p.rule, spans, probe > 0,
                                          sync_rounds(sc.rounds, syncs))

    # --- the phase of a round ------------------------------------------------------------------
    def _phase(self, t: int) -> int:
        return min(int(np.searchsorted(self.last, t)), len(self.last) - 1)

    def first_round(self, p: int) -> int:
        return int(self.last[p - 1]) + 1 if p else 1

    def _kind(self, t: int) -> int:
        """Sensor index of round t's modality, or PROBE / UNDECIDED (adaptive order)."""
        kinds = self.fixed_kinds if self.adaptive is None else self.adaptive.kinds
        return int(kinds[self._phase(t)])

    def modality(self, t: int) -> str:
        k = self._kind(t)
        if k == UNDECIDED:
            raise RuntimeError(f"round {t}: the adaptive chain has not decided this phase yet "
                               "(begin_round was not called)")
        return PROBE_PHASE if k == PROBE else self.sensors[k]

    def preceding(self, m: str) -> tuple[str, ...]:
        """P_m: the modalities before m in the (fixed) chain."""
        return preceding(self.chain, m)

    def _preceding_at(self, t: int) -> tuple[str, ...]:
        if self.adaptive is None:
            return () if self._kind(t) == PROBE else self.preceding(self.modality(t))
        mask = self.adaptive.preceding(self._phase(t))
        return tuple(m for m, on in zip(self.sensors, mask) if on)

    # --- the Schedule protocol ----------------------------------------------------------------
    def active_groups(self, round: int, groups: list[str]) -> tuple[str, ...]:
        if self._kind(round) == PROBE:
            return tuple(g for g in groups if g.startswith("sensor:"))
        return (sensor_group(self.modality(round)),)

    def frozen_groups(self, round: int) -> tuple[str, ...]:
        """Groups the round's training reads but never changes: the earlier modalities (their
        alignment features, complementarity logits and the fused prediction)."""
        return tuple(sensor_group(m) for m in self._preceding_at(round))

    def eligible(self, round: int, sensor_mask: np.ndarray,
                 sensors: tuple[str, ...]) -> np.ndarray:
        if self._kind(round) == PROBE:
            return np.asarray(sensor_mask.any(axis=1))
        return sensor_mask[:, sensors.index(self.modality(round))].astype(bool)

    def phase(self, round: int) -> str:
        return self.modality(round)

    def phase_span(self, round: int) -> tuple[int, int]:
        p = self._phase(round)
        return self.first_round(p), int(self.last[p])

    # --- the adaptive order's hooks (see raymm.server.server) -----------------------------
    def begin_round(self, t: int, obs: Observations) -> None:
        """At a phase's first round, decide its modality from what has been observed."""
        self._round = t
        if self.adaptive is not None:
            self.adaptive.decide(self._phase(t), data_share(obs.sensor_mask, obs.num_samples))

    def report_sensors(self, t: int) -> tuple[str, ...]:
        """Modalities the round's participants report their unimodal accuracy for: in the
        first round and in the last round of every phase, each modality whose server vector a
        participant already holds (trained now, frozen, or still initial)."""
        if self.adaptive is None or not (t == 1 or t in self.last):
            return ()
        p = self._phase(t)
        ask = self.adaptive.trained(p) | self.adaptive.preceding(p) | self.adaptive.untouched(p)
        return tuple(m for m, on in zip(self.sensors, ask) if on)

    def observe(self, report: ModalityReport) -> None:
        if self.adaptive is not None:
            self.adaptive.observe(report.round, report.accuracy())

    def extras(self, round: int) -> dict[str, np.ndarray]:
        """The phase's predecessors, for the devices' stage loss (adaptive order only)."""
        if self.adaptive is None:
            return {}
        return {PRECEDING: self.adaptive.preceding(self._phase(round)).astype(np.float32)}

    def round_stats(self) -> dict[str, float]:
        """The phase index and its modality's sensor index (-1: the probe), and at a report
        round the accuracies the order works with."""
        if self.adaptive is None:
            return {}
        t, a = self._round, self.adaptive
        out: dict[str, float] = {"chain/phase": self._phase(t), "chain/modality": self._kind(t)}
        if t == self.first_round(self._phase(t)):
            for m, s in zip(self.sensors, a.scores[self._phase(t)]):
                out[f"chain/score/{m}"] = float(s)
        for j, m in enumerate(self.sensors):
            out[f"chain/accuracy/{m}"] = float(a.accuracy[j])
            out[f"chain/gain_rate/{m}"] = float(a.gain_rate[j])
        return out

    def state_dict(self) -> dict[str, Any]:
        return {} if self.adaptive is None else self.adaptive.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.adaptive is not None and state:
            self.adaptive.load_state_dict(state)
