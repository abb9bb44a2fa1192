"""An empirical privacy audit: a lower bound on ε from an attacker who tries to tell two
neighbouring worlds apart, run through raymm's own device and server code.

The attacker plants a canary device whose update is a fixed vector along the first
coordinate, repeats a release many times in each of two neighbouring worlds (seeded, so the
audit is reproducible), and scores each release. From the scores a threshold test gives a true
and a false positive rate, and Clopper-Pearson bounds on both give, with 95% confidence,

    ε ≥ ln((TPR_low − δ) / FPR_high)

for any mechanism that is (ε, δ)-DP (Kairouz, Oh and Viswanath 2015; the method of Jagielski,
Ullman and Oprea 2020, and Nasr et al. 2021). The threshold is chosen on the first quarter of
the scores and the bound computed on the rest, so that choosing it costs no confidence.

What the attacker sees follows the threat model of each mode (docs/methods/privacy.md):
central mode, the released mean only; local mode, every device's upload and anything sent
with it. What it knows besides: everything in config.yaml (the scenario's seed), so it can
replay any draw made from the published seed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import numpy as np
from scipy.stats import beta

from policies.selection.basic import RandomSelection
from raymm import seeding
from raymm.config.schema import Scenario
from raymm.protocol.messages import Broadcast, HostResult, RoundPlan, merge_results
from raymm.protocol.privacy import privatize, round_clip, round_noise
from raymm.protocol.seams import SelectionContext
from raymm.server.privacy import PrivacyLedger

#: the group every audited update is made of, and its size
GROUP, SIZE = "shared", 4
#: the canary's direction: the first coordinate
AXIS = 0


def scenario(privacy: dict[str, Any], n: int, k: int, seed: int, rounds: int = 1
             ) -> Scenario:
    """A scenario of `n` always-eligible devices, `k` of them drawn uniformly, with
    `privacy` (the audit needs nothing else of it)."""
    return Scenario.model_validate({"name": "audit", "seed": seed, "rounds": rounds,
                                    "selection": {"name": "random", "k": k},
                                    "privacy": privacy})


def ledger(sc: Scenario, n: int) -> PrivacyLedger:
    pop = SimpleNamespace(n=n, sensor_mask=np.ones((n, 1), bool), sensors=("a",),
                          online=lambda t, ids: np.ones(len(ids), bool))
    joint = SimpleNamespace(eligible=lambda t, mask, sensors: np.ones(len(mask), bool))
    return PrivacyLedger(sc, pop, {GROUP: SIZE}, schedule=joint)


def reported_epsilon(sc: Scenario, n: int) -> float:
    """The ε raymm reports after one release of `sc` (a fresh ledger, everyone eligible)."""
    led = ledger(sc, n)
    led.planned(1, np.arange(n), np.arange(min(sc.selection.k, n)), True)
    return float(led.account(1)["privacy/epsilon"])


def canary(scale: float) -> dict[str, np.ndarray]:
    v = np.zeros(SIZE, np.float32)
    v[AXIS] = scale
    return {GROUP: v}


def cohort(led: PrivacyLedger, t: int, n: int, k: int) -> np.ndarray:
    """Round t's selection as the server draws it (`Server.plan`): the ledger's Poisson
    sample, else the uniform selector on the ledger's stream."""
    eligible = np.arange(n)
    drawn = led.sample(t, eligible)
    if drawn is not None:
        return drawn
    ctx = SelectionContext(t, eligible, eligible, k, None, led.selection_rng(t))  # type: ignore[arg-type]
    return np.sort(RandomSelection(None).select(ctx))


def upload(sc: Scenario, led: PrivacyLedger, t: int, device: int,
           update: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """What device `device` sends in round t: `privatize` with the C and σ the server
    broadcast, read as `DeviceHost` reads them."""
    extras = Broadcast(t, {}, led.extras()).extras
    return privatize(sc.privacy, sc.seed, t, device, update, None,
                     round_clip(sc.privacy, extras), None, round_noise(extras))


@dataclass
class Central:
    """Central mode: the canary (device 0) is in the population or not; the attacker sees
    the released mean. `replay` (the attacker's view of the selection): when set, it
    replays each round's Poisson draw from the published seed and scores only releases it
    believes the canary took part in."""

    privacy: dict[str, Any]
    n: int = 10
    k: int = 1
    replay: bool = False

    def scores(self, present: bool, trials: int, seed: int) -> np.ndarray:
        sc = scenario(self.privacy, self.n, self.k, seed)
        led = ledger(sc, self.n)
        out = np.empty(trials)
        for t in range(1, trials + 1):
            if self.replay and not self._replayed(sc, led, t):
                out[t - 1] = -math.inf  # the attacker believes the canary sat this one out
                continue  # (its score ignores the release, which need not be made)
            chosen = cohort(led, t, self.n, self.k)
            rows = [upload(sc, led, t, int(d), canary(1.0 if present and d == 0 else 0.0))[0]
                    [GROUP] for d in chosen]
            batch = merge_results([HostResult(
                chosen, np.ones(len(chosen), np.int64), np.zeros(len(chosen)),
                np.zeros(len(chosen)), {GROUP: np.array(rows, np.float32).reshape(-1, SIZE)},
                {GROUP: np.arange(len(chosen))})])
            mean = led.release(t, RoundPlan(t, chosen, (GROUP,)),
                               {GROUP: np.zeros(SIZE, np.float32)}, batch).means[GROUP]
            out[t - 1] = mean[AXIS]
        return out

    def _replayed(self, sc: Scenario, led: PrivacyLedger, t: int) -> bool:
        """Whether device 0 is in round t's cohort, by the published seed."""
        gen = seeding.rng(sc.seed, t, seeding.SERVER, "selection")
        return bool(gen.random(self.n)[0] < led.rate)


@dataclass
class Local:
    """Local mode: the canary device holds one of two inputs (its update `a` or `b` along
    the canary's axis); the untrusted server sees its upload and whatever travels with it.
    The score is the upload's first coordinate, or ±∞ when a bit sent with it tells."""

    privacy: dict[str, Any]
    a: float = 1.0
    b: float = -1.0
    n: int = 1

    def scores(self, present: bool, trials: int, seed: int) -> np.ndarray:
        sc = scenario(self.privacy, self.n, self.n, seed)
        led = ledger(sc, self.n)
        out = np.empty(trials)
        for t in range(1, trials + 1):
            sent, extras = upload(sc, led, t, 0, canary(self.a if present else self.b))
            bit = extras.get("privacy/unclipped")
            within_a = abs(self.a) <= (sc.privacy.clip or math.inf)
            out[t - 1] = sent[GROUP][AXIS] if bit is None else (
                math.inf if bool(float(bit)) == within_a else -math.inf)
        return out


def epsilon_lower_bound(inside: np.ndarray, outside: np.ndarray, delta: float,
                        confidence: float = 0.95) -> float:
    """ε that (ε, δ)-DP cannot be below, with `confidence`, given the attacker's scores in
    the two worlds (`inside` higher when the canary is there): the threshold is chosen on
    the first quarter of each, the rates bounded (Clopper-Pearson) on the rest."""
    alpha = 1.0 - confidence
    m = min(len(inside), len(outside)) // 4
    pool = np.concatenate([inside[:m], outside[:m]])
    pool = pool[np.isfinite(pool)]
    # thresholds: high quantiles of the finite scores, and +∞ (a score that is a certainty)
    candidates = [*np.unique(np.quantile(pool, np.linspace(0.5, 0.9999, 80))), math.inf] \
        if pool.size else [math.inf]

    def bound(a: np.ndarray, b: np.ndarray, thr: float, level: float) -> float:
        tp, fp = int((a >= thr).sum()), int((b >= thr).sum())
        low = 0.0 if tp == 0 else float(beta.ppf(level, tp, len(a) - tp + 1))
        high = 1.0 if fp == len(b) else float(beta.ppf(1 - level, fp + 1, len(b) - fp))
        return math.log((low - delta) / high) if low > delta else 0.0

    thr = max(candidates, key=lambda c: bound(inside[:m], outside[:m], float(c), alpha))
    return max(0.0, bound(inside[m:], outside[m:], float(thr), alpha))


def audit(world: Central | Local, trials: int, delta: float,
          seeds: tuple[int, int] = (1, 2)) -> float:
    """The lower bound on ε from `trials` releases in each world (the canary in, or out)."""
    return epsilon_lower_bound(world.scores(True, trials, seeds[0]),
                               world.scores(False, trials, seeds[1]), delta)



if __name__ == "__main__":  # the audit's figures, with tests/unit/test_privacy_audit.py's settings
    import sys

    import pytest

    sys.path[:0] = ["tests", "tests/unit"]
    import privacy_audit as pa  # this file as the tests import it (their patches act on it)
    import test_privacy_audit as cases

    secret = {**cases.POISSON, "selection_secret": cases.SECRET}
    rows = [("central, σ 1, both devices in every release", cases.CENTRAL, 2, 2,
             pa.Central(cases.CENTRAL, n=2, k=2), 6000, None),
            ("local, σ 2, inputs ±C", cases.LOCAL, 1, 1, pa.Local(cases.LOCAL), 40_000, None),
            ("local, σ solved for ε 1", cases.LOCAL_TARGET, 1, 1,
             pa.Local(cases.LOCAL_TARGET), 4000, None),
            ("local, σ 2, inputs 0.5C and 3C", cases.LOCAL, 1, 1,
             pa.Local(cases.LOCAL, a=0.5, b=3.0), 4000, None),
            ("central, σ 2, secret Poisson cohort q 0.1, the attacker replays the published "
             "seed", secret, 10, 1, pa.Central(secret, n=10, k=1, replay=True), 40_000, None),
            ("fault 1: local devices read the unset σ", cases.LOCAL_TARGET, 1, 1,
             pa.Local(cases.LOCAL_TARGET), 4000, cases._devices_read_the_scenario_sigma),
            ("fault 2: clipping bit in the clear", cases.LOCAL, 1, 1,
             pa.Local(cases.LOCAL, a=0.5, b=3.0), 4000, cases._bit_in_the_clear),
            ("fault 3: local accounted at sensitivity C", cases.LOCAL, 1, 1,
             pa.Local(cases.LOCAL), 40_000, cases._local_sensitivity_c),
            ("fault 4: amplified from the published seed", cases.POISSON, 10, 1,
             pa.Central(cases.POISSON, n=10, k=1, replay=True), 40_000,
             cases._amplified_without_secret)]
    print("| setting | releases a world | reported ε | attack's lower bound |")
    print("|---|---|---|---|")
    for name, priv, n, k, world, trials, fault in rows:
        with pytest.MonkeyPatch.context() as mp:
            if fault is not None:
                fault(mp)
            rep = pa.reported_epsilon(pa.scenario(priv, n, k, seed=1), n)
            lb = pa.audit(world, trials, cases.DELTA)
        print(f"| {name} | {trials} | {rep:.3f} | {lb:.3f} |", flush=True)
