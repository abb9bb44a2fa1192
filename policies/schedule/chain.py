"""Modality-chained training (FedMChain's MCFT): one phase per modality, in chain order.

In the phase of modality m only devices holding m are eligible and only the group `sensor:m`
(m's encoder and its classifier) is trained, sent and aggregated; every other branch stays
frozen. Needs late fusion by summed logits (`model.fusion: sum_logits`): with a shared fusion
layer there would be a group no phase trains.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from raymm.errors import ScenarioError
from raymm.models.network import sensor_group
from raymm.registry import SCHEDULES


class ChainParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    #: modality order, e.g. [audio, visual]; None = the dataset's sensor order
    chain: list[str] | None = Field(default=None, min_length=1)
    #: rounds per phase (must add up to the run's rounds); None = an equal split, the
    #: remainder going to the earliest phases
    rounds: list[int] | None = Field(default=None, min_length=1)


def phase_lengths(total: int, phases: int) -> list[int]:
    base, rest = divmod(total, phases)
    return [base + (1 if i < rest else 0) for i in range(phases)]


def resolve_chain(chain: Sequence[str] | None, sensors: tuple[str, ...]) -> tuple[str, ...]:
    """The modality order of a run: the configured `chain`, or the dataset's sensor order."""
    return tuple(chain or sensors)


def preceding(chain: tuple[str, ...], m: str) -> tuple[str, ...]:
    """P_m: the modalities before m in `chain`."""
    return chain[:chain.index(m)]


@SCHEDULES.register("modality_chain")
class ModalityChain:
    Params = ChainParams

    def __init__(self, params: ChainParams) -> None:
        self.params = params
        self.chain: tuple[str, ...] = tuple(params.chain or ())
        self.last = np.zeros(0, np.int64)   # last round of each phase

    def bind(self, sc: Any, sensors: tuple[str, ...]) -> None:
        """Resolve the chain and the phase boundaries against the run (raises ScenarioError)."""
        chain = list(resolve_chain(self.params.chain, sensors))
        problems = []
        bad = [m for m in chain if m not in sensors]
        if bad:
            problems.append(f"schedule.chain: {bad} not among the dataset's sensors {sensors}")
        if len(set(chain)) != len(chain):
            problems.append(f"schedule.chain: repeats a modality: {chain}")
        lengths = self.params.rounds or phase_lengths(sc.rounds, len(chain))
        if len(lengths) != len(chain) or sum(lengths) != sc.rounds or min(lengths) < 1:
            problems.append(f"schedule.rounds: {lengths} must give every one of the {len(chain)} "
                            f"phases ≥ 1 round and add up to rounds={sc.rounds}")
        if sc.model.fusion != "sum_logits":
            problems.append("model.fusion: modality_chain needs sum_logits (late fusion)")
        if problems:
            raise ScenarioError(problems)
        self.chain = tuple(chain)
        self.last = np.cumsum(lengths).astype(np.int64)

    def _phase(self, t: int) -> int:
        return min(int(np.searchsorted(self.last, t)), len(self.chain) - 1)

    def modality(self, t: int) -> str:
        return self.chain[self._phase(t)]

    def preceding(self, m: str) -> tuple[str, ...]:
        """P_m: the modalities before m in the chain."""
        return preceding(self.chain, m)

    def active_groups(self, round: int, groups: list[str]) -> tuple[str, ...]:
        return (sensor_group(self.modality(round)),)

    def frozen_groups(self, round: int) -> tuple[str, ...]:
        """Groups the round's training reads but never changes: the earlier modalities (their
        alignment features, complementarity logits and the fused prediction)."""
        return tuple(sensor_group(m) for m in self.preceding(self.modality(round)))

    def eligible(self, round: int, sensor_mask: np.ndarray,
                 sensors: tuple[str, ...]) -> np.ndarray:
        return sensor_mask[:, sensors.index(self.modality(round))].astype(bool)

    def phase(self, round: int) -> str:
        return self.modality(round)

    def phase_span(self, round: int) -> tuple[int, int]:
        p = self._phase(round)
        return (int(self.last[p - 1]) + 1 if p else 1), int(self.last[p])
