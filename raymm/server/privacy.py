"""The server's half of differential privacy (docs/methods/privacy.md): Gaussian noise on the
round's sum of clipped updates, the fixed denominator, adaptive clipping, the participation
cap, and the accountant's ε after every release, with the sampling assumption it rests on.

Devices clip (`raymm.protocol.privacy`); hosts may pre-sum clipped updates in id blocks; here,
once per round, the sum S_g of every released group g becomes the mean the aggregator sees:

    Δ̄_g = (S_g + N(0, (σ·C)²·I)) / D_g

D_g is fixed before the run (never the realised count). An aggregator of parameters gets
θ_g + Δ̄_g, one of deltas Δ̄_g, through `UpdateBatch.means`: every aggregator that depends on
the updates only through `weighted_mean` (the `combinable` ones) runs unchanged.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np

from raymm import seeding
from raymm.config.schema import Scenario
from raymm.population.devices import Population
from raymm.protocol import combine
from raymm.protocol.exchange import sync_window
from raymm.protocol.messages import RoundPlan, UpdateBatch
from raymm.protocol.privacy import CLIP, UNCLIPPED
from raymm.protocol.seams import Schedule
from raymm.server import accounting

#: selectors that draw uniformly at random among the eligible devices: the only ones under
#: which amplification by sampling can hold (and then only when every device is eligible)
UNIFORM_SELECTORS = ("random", "fraction")


def default_delta(n_devices: int) -> float:
    """δ = 1 / N^1.1: below 1/N, so that (ε, δ) cannot be met by releasing one device's data."""
    return 1.0 / n_devices ** 1.1


class PrivacyLedger:
    """Noise, denominators, adaptive C, the participation cap and the accountant of one run."""

    def __init__(self, sc: Scenario, population: Population, sizes: dict[str, int],
                 schedule: Schedule, combinable: bool = True) -> None:
        p = self.p = sc.privacy
        # local DP with an aggregator of rows (SSCA): the noised deltas go to it as they are
        self.rows = p.mode == "local" and not combinable
        self.seed, self.n, self.k = sc.seed, population.n, sc.selection.k
        self.sizes = sizes  # travelling groups -> parameter count
        self.delta = p.delta if p.delta is not None else default_delta(self.n)
        self.exchange = sc.training.exchange
        self.uniform = sc.selection.name in UNIFORM_SELECTORS
        self.selector = sc.selection.name
        frac = sc.selection.params().get("fraction") if sc.selection.name == "fraction" else None
        base = p.denominator if p.denominator is not None else (
            min(self.k, self.n) if frac is None else min(self.k, float(frac) * self.n))
        self.expected = float(base)
        # D_g: the expected number of senders of g (the share of devices able to send it)
        held = population.sensor_mask.sum(axis=0)
        sensors = population.sensors
        self.denominators = {g: self.expected * (
            held[sensors.index(g.partition(":")[2])] / self.n
            if g.startswith("sensor:") and sc.training.upload == "held" else 1.0)
            for g in sizes}
        self.clip = p.clip  # C now (adaptive clipping moves it)
        self.sigma = p.noise_multiplier if p.noise_multiplier is not None else \
            self._calibrate(sc, population, schedule)
        # σ_b: Andrew et al.'s expected/20, but at least σ (the update keeps σ·1.15 then)
        self.count_noise = p.count_noise if p.count_noise is not None else \
            max(self.expected / 20, self.sigma)
        if p.adaptive_clip and self.sigma >= 2 * self.count_noise:
            raise ValueError(f"privacy: adaptive clipping needs σ ({self.sigma:.4g}) below "
                             f"2·count_noise ({2 * self.count_noise:.4g})")
        # the update's own multiplier: with adaptive clipping part of σ is spent on the count
        self.sigma_update = self.sigma if not p.adaptive_clip or self.sigma == 0 else \
            (self.sigma ** -2 - (2 * self.count_noise) ** -2) ** -0.5
        # the books (all in `state_dict`)
        self.releases = 0
        self.sampled: dict[float, int] = {}      # q -> releases with everyone eligible
        self.broken: str | None = None           # why amplification does not hold
        self.eligible_count = np.zeros(self.n, np.int64)  # releases a device was eligible for
        self.selected_count = np.zeros(self.n, np.int64)  # releases a device was selected for
        self.pending: dict[int, tuple[np.ndarray, bool, int]] = {}
        if not self.uniform:
            self.broken = f"selection {self.selector!r} is not uniform at random"
        elif p.max_participation is not None:
            self.broken = "max_participation makes selection depend on past selections"
        elif p.mode == "local":
            self.broken = "local DP: the server sees who sends"

    # --- before the run ----------------------------------------------------------------
    def _calibrate(self, sc: Scenario, population: Population, schedule: Schedule) -> float:
        """σ solved for `target_epsilon` over the run's releases (its sync rounds), with the
        amplification the run will get if every device stays eligible, else each device's
        bound of participations (the releases it is online and admitted for, the cap). An
        adaptive schedule is refused with privacy, so `eligible` is a function of the round."""
        rounds = [t for t in range(1, sc.rounds + 1) if sync_window(t, sc, schedule)[1]]
        ids = np.arange(self.n)
        online = np.zeros(self.n, np.int64)
        # on the seconds clock a release's instant is known only when the run gets there: a
        # device counts as online at every release, and as such for the amplification only
        # if it never leaves (conservative: a larger bound, never a smaller one)
        seconds = sc.clock.mode == "seconds"
        always = bool(np.isinf(population.availability.departure(0.0, ids)).all()) \
            if seconds else True
        everyone = always
        for t in rounds:  # who can be picked at each release: online, and admitted by a
            # fixed schedule (a chain's phase)
            on = np.ones(self.n, bool) if seconds else population.online(t, ids)
            on[on] = schedule.eligible(t, population.sensor_mask[on], population.sensors)
            online += on
            everyone = everyone and bool(on.all())
        target = self.p.target_epsilon
        assert target is not None  # the schema asks for it when σ is not given
        if self.uniform and everyone and self.p.max_participation is None \
                and self.p.mode == "central":
            q = min(self.expected / self.n, 1.0)
            return accounting.calibrate(self.p.accountant,
                                        lambda s: accounting.event(s, {q: len(rounds)}),
                                        target, self.delta)
        bound = int(online.max()) if len(rounds) else 0
        if self.p.max_participation is not None:
            bound = min(bound, self.p.max_participation)
        return accounting.calibrate(self.p.accountant,
                                    lambda s: accounting.event(s, count=bound),
                                    target, self.delta)

    # --- planning --------------------------------------------------------------------
    def extras(self) -> dict[str, np.ndarray]:
        """The round's C, broadcast to the selected devices (they clip with it)."""
        return {CLIP: np.array([np.nan if self.clip is None else self.clip], np.float64)} \
            if self.p.adaptive_clip else {}

    def eligible(self, eligible: np.ndarray) -> np.ndarray:
        """Drop devices that reached `max_participation` (they are never selected again)."""
        cap = self.p.max_participation
        return eligible if cap is None else eligible[self.selected_count[eligible] < cap]

    def planned(self, t: int, eligible: np.ndarray, selected: np.ndarray, upload: bool
                ) -> None:
        """Round t's plan: who was eligible and selected, whether it releases an update."""
        if upload:
            self.selected_count[selected] += 1
        self.pending[t] = (eligible.copy(), upload, int(selected.shape[0]))

    # --- the release -------------------------------------------------------------------
    def release(self, t: int, plan: RoundPlan, params: dict[str, np.ndarray],
                batch: UpdateBatch) -> UpdateBatch:
        """The batch the aggregator sees: every released group's noised mean (`means`), no
        rows, no privacy extras. Groups released: the plan's active travelling groups, sent by
        somebody or not (a group nobody sent is noise around θ, like any other)."""
        other = sorted(set(batch.extras) - {UNCLIPPED}) + sorted(batch.reports)
        if other:
            raise RuntimeError(f"privacy: devices sent {other} besides their updates; the "
                               "mechanism covers only the clipped updates (docs/methods/"
                               "privacy.md lists the settings that send nothing else)")
        extras = {k: v for k, v in batch.extras.items() if k != UNCLIPPED}
        if self.rows:
            return replace(batch, extras=extras)
        clip = self.clip
        means = {}
        for g in sorted(set(plan.active_groups) & set(self.sizes)):
            parts = batch.sums(g, np.ones(batch.senders[g].shape[0])
                               if g in batch.senders else None)
            total = combine.sum_of(parts) if parts else np.zeros(self.sizes[g])
            if self.p.mode == "central" and self.sigma_update > 0 and clip is not None:
                gen = seeding.rng(self.seed, t, seeding.SERVER, "privacy/noise/" + g)
                total = total + gen.normal(0.0, self.sigma_update * clip, total.shape)
            mean = total / self.denominators[g]
            means[g] = (mean if self.exchange == "delta"
                        else np.asarray(params[g], np.float64) + mean).astype(np.float32)
        self._adapt(t, batch)
        return replace(batch, updates={}, senders={}, partials={}, extras=extras, means=means)

    def _adapt(self, t: int, batch: UpdateBatch) -> None:
        """Adaptive clipping: C ← C·exp(−η·(b̄ − γ)), b̄ the noised share of unclipped updates
        (each bit centred at ½, so one device moves the sum by ½ at most)."""
        if not self.p.adaptive_clip or self.clip is None:
            return
        bits = batch.extras.get(UNCLIPPED, np.zeros(0, np.float32)).astype(np.float64)
        gen = seeding.rng(self.seed, t, seeding.SERVER, "privacy/count")
        noisy = float(np.add.reduce(bits - 0.5)) + gen.normal(0.0, self.count_noise)
        share = noisy / self.expected + 0.5
        self.last_share = share
        self.clip = self.clip * math.exp(-self.p.clip_lr * (share - self.p.target_quantile))

    # --- the accountant ---------------------------------------------------------------
    def account(self, t: int) -> dict[str, Any]:
        """Round t's columns: ε so far at δ, and the assumption it rests on."""
        eligible, upload, n_selected = self.pending.pop(t, (np.zeros(0, np.int64), False, 0))
        if upload:
            self.releases += 1
            self.eligible_count[eligible] += 1
            if self.broken is None and eligible.shape[0] < self.n:
                self.broken = (f"round {t}: {eligible.shape[0]} of {self.n} devices eligible "
                               "(availability or schedule decides who can be picked)")
            if self.broken is None:
                q = n_selected / self.n
                self.sampled[q] = self.sampled.get(q, 0) + 1
        eps = self.epsilon()
        row: dict[str, Any] = {
            "privacy/epsilon": eps, "privacy/delta": self.delta,
            "privacy/noise_multiplier": self.sigma,
            "privacy/clip": math.inf if self.clip is None else float(self.clip),
            "privacy/releases": self.releases,
            "privacy/compositions": self.bound(),
            "privacy/sampling_rate": self._rate(),
            "privacy/assumption": self.assumption()}
        if self.p.adaptive_clip and hasattr(self, "last_share") and upload:
            row["privacy/unclipped_share"] = float(self.last_share)
        target = self.p.target_epsilon
        if target is not None and self.p.on_target == "stop" and self.epsilon(1) > target:
            row["privacy/budget_reached"] = 1
        return row

    def bound(self) -> int:
        """How many releases one device can have taken part in: all of them, or fewer where
        it was not eligible (availability, schedule) or the cap stopped it."""
        b = int(self.eligible_count.max()) if self.n else 0
        if self.p.max_participation is not None:
            b = min(b, self.p.max_participation)
        return min(b, self.releases)

    def _rate(self) -> float:
        if self.broken is not None or not self.sampled:
            return 0.0
        return max(self.sampled)

    def epsilon(self, more: int = 0) -> float:
        """ε at δ after the releases so far (and `more` to come, in the same way)."""
        if self.broken is None:
            sampled = dict(self.sampled)
            if more:
                q = max(sampled) if sampled else min(self.expected / self.n, 1.0)
                sampled[q] = sampled.get(q, 0) + more
            ev = accounting.event(self.sigma, sampled)
            if not sampled:
                return 0.0
        else:
            ev = accounting.event(self.sigma, count=self.bound() + more)
        return accounting.epsilon(self.p.accountant, ev, self.delta)

    def assumption(self) -> str:
        """The sampling assumption of this run's ε, in words (a column and a summary entry)."""
        what = "local DP" if self.p.mode == "local" else "central DP"
        if self.broken is None:
            q = self._rate() or self.expected / self.n
            return (f"{what}, Poisson-sampled Gaussian, q = {q:.4g}: uniform {self.selector!r} "
                    f"selection among all {self.n} devices, every device eligible every round "
                    "(fixed-size sampling accounted as Poisson sampling at the same rate)")
        return (f"{what}, no amplification ({self.broken}): every participation composed, "
                f"at most {self.bound()} per device")

    # --- checkpoints -------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"clip": np.nan if self.clip is None else self.clip, "releases": self.releases,
                "sampled": {str(q): c for q, c in self.sampled.items()},
                "broken": self.broken or "", "sigma": self.sigma,
                "eligible_count": self.eligible_count.copy(),
                "selected_count": self.selected_count.copy(),
                "pending": {str(t): {"eligible": e.copy(), "upload": u, "selected": s}
                            for t, (e, u, s) in self.pending.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        clip = float(state["clip"])
        self.clip = None if math.isnan(clip) else clip
        self.releases = int(state["releases"])
        self.sampled = {float(q): int(c) for q, c in state["sampled"].items()}
        self.broken = str(state["broken"]) or None
        self.sigma = float(state["sigma"])
        self.eligible_count = np.asarray(state["eligible_count"], np.int64).copy()
        self.selected_count = np.asarray(state["selected_count"], np.int64).copy()
        self.pending = {int(t): (np.asarray(v["eligible"], np.int64), bool(v["upload"]),
                                 int(v["selected"])) for t, v in state["pending"].items()}
