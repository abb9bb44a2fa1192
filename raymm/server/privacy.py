"""The server's half of differential privacy (docs/methods/privacy.md): Gaussian noise on the
round's sum of clipped updates, the fixed denominator, adaptive clipping, the participation
cap, and the accountant's ε after every release, with the sampling assumption it rests on.

Devices clip (`raymm.protocol.privacy`); hosts may pre-sum clipped updates in id blocks; here,
once per round, the sum S_g of every released group g becomes the mean the aggregator sees:

    Δ̄_g = (S_g + N(0, (σ·C)²·I)) / D_g

D_g is fixed before the run (never the realised count). An aggregator of parameters gets
θ_g + Δ̄_g, one of deltas Δ̄_g, through `UpdateBatch.means`: every aggregator that depends on
the updates only through `weighted_mean` (the `combinable` ones) runs unchanged.

The accountant's multiplier is σ / s, s the sensitivity of one device's update in units of C:
1 in central mode (add or remove one device's clipped update), 2 in local mode (a device's two
possible inputs give clipped updates up to 2C apart, and the untrusted server sees each one).
Amplification by sampling is claimed only where the cohort is a Poisson sample drawn from a
secret stream the published files cannot replay (`privacy.selection_secret`).
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
from raymm.protocol.privacy import CLIP, NOISE, UNCLIPPED
from raymm.protocol.registry import policy_params
from raymm.protocol.seams import Schedule
from raymm.server import accounting

#: selectors that draw uniformly at random among the eligible devices: the only ones under
#: which amplification by sampling can hold (and then only when every device is eligible)
UNIFORM_SELECTORS = ("random", "fraction")
#: the sensitivity of one device's clipped update, in units of C, per mode: the neighbouring
#: runs central mode compares differ by one device's presence (its update of norm ≤ C), the
#: ones local mode compares by that device's input (two updates of norm ≤ C each, so 2C apart)
SENSITIVITY = {"central": 1.0, "local": 2.0}
#: δ never above this by default, whatever N
DELTA_CEILING = 1e-5


def default_delta(n_devices: int) -> float:
    """δ = min(1/N², 1e-5): far below 1/N, the level at which publishing one device's data
    at random would already meet (ε, δ)."""
    return min(1.0 / n_devices ** 2, DELTA_CEILING)


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
        self.sensitivity = SENSITIVITY[p.mode]
        self.secret = p.selection_secret
        # the selector's own default when the scenario leaves `fraction` out
        frac = getattr(policy_params(sc, "selection"), "fraction", None) \
            if sc.selection.name == "fraction" else None
        cohort = min(self.k, self.n) if frac is None else min(self.k, float(frac) * self.n)
        # q of `sampling: poisson`: each eligible device's chance to be in a release's cohort
        self.rate = min(float(cohort) / self.n, 1.0)
        self.poisson = p.sampling == "poisson" and self.uniform
        base = p.denominator if p.denominator is not None else cohort
        self.expected = float(base)
        # D_g: the expected number of senders of g (the share of devices able to send it)
        held = population.sensor_mask.sum(axis=0)
        sensors = population.sensors
        self.denominators = {g: self.expected * (
            held[sensors.index(g.partition(":")[2])] / self.n
            if g.startswith("sensor:") and sc.training.upload == "held" else 1.0)
            for g in sizes}
        self.clip = p.clip  # C now (adaptive clipping moves it)
        self.broken = self._why_not_amplified()
        # the run's releases (its upload rounds): what a device budget's cap is solved over
        self.planned_releases = sum(1 for t in range(1, sc.rounds + 1)
                                    if sync_window(t, sc, schedule)[1])
        self._set_sigma(p.noise_multiplier if p.noise_multiplier is not None else
                        self._calibrate(sc, population, schedule))
        # the books (all in `state_dict`)
        self.releases = 0
        self.sampled: dict[float, int] = {}      # q -> releases with everyone eligible
        self.eligible_count = np.zeros(self.n, np.int64)  # releases a device was eligible for
        self.selected_count = np.zeros(self.n, np.int64)  # releases a device was selected for
        self.pending: dict[int, tuple[np.ndarray, bool, int]] = {}
        #: float64 [N]: each device's ε as of the last `account`
        self.last_device_epsilon = np.zeros(self.n)

    def _why_not_amplified(self) -> str | None:
        """Why this run cannot claim amplification by sampling (None: it can, as long as every
        device stays eligible): the draw must be uniform, independent of the past, Poisson, and
        secret from whoever reads the released models and the run's published files."""
        p = self.p
        if p.mode == "local":
            return "local DP: the server sees who sends"
        if not self.uniform:
            return f"selection {self.selector!r} is not uniform at random"
        if p.max_participation is not None or p.device_budget is not None:
            return "a participation cap makes selection depend on past selections"
        if not self.poisson:
            return ("a fixed-size cohort (privacy.sampling: fixed) is not the Poisson sample "
                    "the amplification is accounted for")
        if self.secret is None:
            return ("the selection is drawn from the published seed (config.yaml), so anyone "
                    "can replay who was selected; give privacy.selection_secret")
        return None

    def _set_sigma(self, sigma: float) -> None:
        """σ and what follows from it: the count's noise and the update's own share under
        adaptive clipping, and the participation cap a device budget allows."""
        p = self.p
        self.sigma = sigma
        self._eps_at: dict[int, float] = {}  # ε of c composed participations, by c
        # σ_b: Andrew et al.'s expected/20, but at least σ (the update keeps σ·1.15 then)
        self.count_noise = p.count_noise if p.count_noise is not None else \
            max(self.expected / 20, self.sigma)
        if p.adaptive_clip and self.sigma >= 2 * self.count_noise:
            raise ValueError(f"privacy: adaptive clipping needs σ ({self.sigma:.4g}) below "
                             f"2·count_noise ({2 * self.count_noise:.4g})")
        # the update's own multiplier: with adaptive clipping part of σ is spent on the count
        self.sigma_update = self.sigma if not p.adaptive_clip or self.sigma == 0 else \
            (self.sigma ** -2 - (2 * self.count_noise) ** -2) ** -0.5
        self.cap = self._participation_cap()

    def _participation_cap(self) -> int | None:
        """The most releases one device may take part in: `max_participation`, lowered to what
        `device_budget` allows (the largest count whose ε stays within it)."""
        cap = self.p.max_participation
        budget = self.p.device_budget
        if budget is None:
            return cap
        most = self.planned_releases
        if cap is not None:
            most = min(most, cap)
        low, high = 0, most  # ε grows with the count: the largest count within the budget
        while low < high:
            mid = (low + high + 1) // 2
            low, high = (mid, high) if self._composed_epsilon(mid) <= budget else (low, mid - 1)
        return low

    def _composed_epsilon(self, count: int) -> float:
        """ε at δ of `count` unamplified participations (memoised: σ is fixed for the run)."""
        if count not in self._eps_at:
            self._eps_at[count] = accounting.epsilon(
                self.p.accountant, accounting.event(self.multiplier, count=count), self.delta)
        return self._eps_at[count]

    @property
    def multiplier(self) -> float:
        """The accountant's noise multiplier: σ over the sensitivity in units of C."""
        return self.sigma / self.sensitivity

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
        if self.broken is None and everyone:
            q = self.rate
            solved = accounting.calibrate(self.p.accountant,
                                          lambda s: accounting.event(s, {q: len(rounds)}),
                                          target, self.delta)
        else:
            bound = int(online.max()) if len(rounds) else 0
            if self.p.max_participation is not None:
                bound = min(bound, self.p.max_participation)
            solved = accounting.calibrate(self.p.accountant,
                                          lambda s: accounting.event(s, count=bound),
                                          target, self.delta)
        return solved * self.sensitivity  # the devices' (or server's) σ, in units of C

    # --- planning --------------------------------------------------------------------
    def extras(self) -> dict[str, np.ndarray]:
        """What the selected devices need from the server: the round's C under adaptive
        clipping (they clip with it), and in local mode the σ they noise with (solved here
        when the scenario gives a target ε instead)."""
        out = {}
        if self.p.adaptive_clip:
            out[CLIP] = np.array([np.nan if self.clip is None else self.clip], np.float64)
        if self.p.mode == "local":
            out[NOISE] = np.array([self.sigma], np.float64)
        return out

    def eligible(self, eligible: np.ndarray) -> np.ndarray:
        """Drop devices at their participation cap (`max_participation`, `device_budget`):
        they are never selected again."""
        cap = self.cap
        return eligible if cap is None else eligible[self.selected_count[eligible] < cap]

    def selection_rng(self, t: int) -> np.random.Generator:
        """The stream round t's selection draws from: the secret's when one is given (the
        published seed cannot replay it), the scenario seed's otherwise."""
        return seeding.rng(self.seed if self.secret is None else self.secret, t,
                           seeding.SERVER, "selection")

    def sample(self, t: int, eligible: np.ndarray) -> np.ndarray | None:
        """`sampling: poisson` under a uniform selector: each eligible device joins round t's
        cohort with probability q, independently; None leaves the draw to the selector."""
        if not self.poisson:
            return None
        return eligible[self.selection_rng(t).random(eligible.shape[0]) < self.rate]

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
                self.sampled[self.rate] = self.sampled.get(self.rate, 0) + 1
        eps = self.epsilon()
        row: dict[str, Any] = {
            "privacy/epsilon": eps, "privacy/delta": self.delta,
            "privacy/noise_multiplier": self.sigma,
            "privacy/clip": math.inf if self.clip is None else float(self.clip),
            "privacy/releases": self.releases,
            "privacy/compositions": self.bound(),
            "privacy/sampling_rate": self._rate(),
            "privacy/assumption": self.assumption()}
        self.last_device_epsilon = self.device_epsilon()  # the round's record carries it
        row["privacy/device_epsilon_median"] = \
            float(np.median(self.last_device_epsilon)) if self.n else 0.0
        if self.cap is not None:
            row["privacy/devices_at_cap"] = int((self.selected_count >= self.cap).sum())
        if self.p.adaptive_clip and hasattr(self, "last_share") and upload:
            row["privacy/unclipped_share"] = float(self.last_share)
        target = self.p.target_epsilon
        if target is not None and self.p.on_target == "stop" and self.epsilon(1) > target:
            row["privacy/budget_reached"] = 1
        return row

    def bound(self) -> int:
        """How many releases one device can have taken part in: all of them, or fewer where
        it was not eligible (availability, schedule) or the cap stopped it."""
        return int(self.device_bounds().max()) if self.n else 0

    def device_bounds(self) -> np.ndarray:
        """int64 [N]: per device, the releases it could have taken part in so far: those it
        was eligible for (a fixed function of the public clocks and schedule, never of its
        data), at most the cap."""
        b = np.minimum(self.eligible_count, self.releases)
        return b if self.cap is None else np.minimum(b, self.cap)

    def device_epsilon(self) -> np.ndarray:
        """float64 [N]: each device's ε at δ so far. Amplified, every device's is the run's;
        composed, device i's is its own `device_bounds()[i]` participations composed. The run's
        `privacy/epsilon` is the largest of them."""
        if self.broken is None:
            return np.full(self.n, self.epsilon())
        counts, which = np.unique(self.device_bounds(), return_inverse=True)
        return np.array([self._composed_epsilon(int(c)) for c in counts], np.float64)[which]

    def _rate(self) -> float:
        if self.broken is not None or not self.sampled:
            return 0.0
        return max(self.sampled)

    def epsilon(self, more: int = 0) -> float:
        """ε at δ after the releases so far (and `more` to come, in the same way)."""
        if self.broken is None:
            sampled = dict(self.sampled)
            if more:
                q = max(sampled) if sampled else self.rate
                sampled[q] = sampled.get(q, 0) + more
            ev = accounting.event(self.multiplier, sampled)
            if not sampled:
                return 0.0
        else:
            return self._composed_epsilon(self.bound() + more)
        return accounting.epsilon(self.p.accountant, ev, self.delta)

    def assumption(self) -> str:
        """The sampling assumption of this run's ε, in words (a column and a summary entry)."""
        what = ("local DP, sensitivity 2C (the server sees every device's upload)"
                if self.p.mode == "local" else "central DP, sensitivity C (trusted server)")
        if self.broken is None:
            return (f"{what}, Poisson-sampled Gaussian, q = {self.rate:.4g}: every one of the "
                    f"{self.n} devices eligible at every release and drawn independently from "
                    "the secret selection stream (privacy.selection_secret, not published)")
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
                            for t, (e, u, s) in self.pending.items()},
                # the trusted server's secret travels in its own checkpoint (never in
                # config.yaml), so that a resumed run draws the same cohorts
                "secret": -1 if self.secret is None else self.secret,
                "device_epsilon": self.device_epsilon()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        clip = float(state["clip"])
        self.clip = None if math.isnan(clip) else clip
        self.releases = int(state["releases"])
        self.sampled = {float(q): int(c) for q, c in state["sampled"].items()}
        self.broken = str(state["broken"]) or None
        sigma = float(state["sigma"])
        self.eligible_count = np.asarray(state["eligible_count"], np.int64).copy()
        self.selected_count = np.asarray(state["selected_count"], np.int64).copy()
        self.pending = {int(t): (np.asarray(v["eligible"], np.int64), bool(v["upload"]),
                                 int(v["selected"])) for t, v in state["pending"].items()}
        secret = int(state.get("secret", -1))
        if secret >= 0:
            self.secret = secret
        if sigma != self.sigma:  # solved under the secret the checkpoint restores
            self._set_sigma(sigma)
