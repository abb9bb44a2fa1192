"""ε of a run's releases, from Google's dp-accounting (RDP or PLD); never computed by hand.

A run's guarantee is one of two compositions (docs/methods/privacy.md says which applies when):

- *amplified*: every release a Gaussian mechanism of noise multiplier σ on a Poisson sample of
  rate q (`PoissonSampledDpEvent`), self-composed over the releases at each rate;
- *composed*: every participation a Gaussian mechanism of multiplier σ (`GaussianDpEvent`),
  self-composed as often as a device can take part.

Both under add-or-remove-one-device adjacency: the guarantee is user level.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping

import dp_accounting
from dp_accounting import pld, rdp

# the RDP accountant warns (through absl) each time it drops a fractional order whose series
# did not converge; ε is then the minimum over the other orders, still an upper bound
logging.getLogger("absl").setLevel(logging.ERROR)


def accountant(kind: str) -> dp_accounting.PrivacyAccountant:
    """A fresh accountant: `rdp` (Rényi DP, the library's default orders) or `pld`."""
    if kind == "rdp":
        return rdp.RdpAccountant()
    if kind == "pld":
        return pld.PLDAccountant()
    raise ValueError(f"unknown accountant {kind!r}")


def event(sigma: float, sampled: Mapping[float, int] | None = None, count: int = 0
          ) -> dp_accounting.DpEvent:
    """The releases as one dp-accounting event: `sampled` maps each sampling rate q to the
    releases made at it (amplified); otherwise `count` participations, each unamplified."""
    gauss = dp_accounting.GaussianDpEvent(sigma)
    if sampled:
        parts: list[dp_accounting.DpEvent] = [
            dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(q, gauss), c)
            for q, c in sorted(sampled.items()) if c > 0]
        return parts[0] if len(parts) == 1 else dp_accounting.ComposedDpEvent(parts)
    return dp_accounting.SelfComposedDpEvent(gauss, count)


def epsilon(kind: str, ev: dp_accounting.DpEvent, delta: float) -> float:
    """ε at `delta` of `ev`: 0 when nothing was released, ∞ without noise."""
    if _releases(ev) == 0:
        return 0.0
    if _sigma(ev) == 0:
        return math.inf
    acc = accountant(kind)
    acc.compose(ev)
    return float(acc.get_epsilon(delta))


def calibrate(kind: str, make: Callable[[float], dp_accounting.DpEvent], target: float,
              delta: float) -> float:
    """The smallest noise multiplier σ whose event `make(σ)` spends at most `target` at
    `delta` (the library's own bisection). PLD's bisection starts from RDP's answer (an upper
    end: RDP's ε is the larger at any σ), since a PLD at a tiny σ does not fit in memory."""
    rdp_sigma = float(dp_accounting.calibrate_dp_mechanism(
        lambda: accountant("rdp"), make, target, delta,
        dp_accounting.LowerEndpointAndGuess(1e-3, 1.0), tol=1e-4))
    if kind == "rdp":
        return rdp_sigma
    low = rdp_sigma / 2
    while low > 1e-2 and epsilon(kind, make(low), delta) <= target:
        low /= 2
    return float(dp_accounting.calibrate_dp_mechanism(
        lambda: accountant(kind), make, target, delta,
        dp_accounting.ExplicitBracketInterval(low, rdp_sigma), tol=1e-4))


def _releases(ev: dp_accounting.DpEvent) -> int:
    if isinstance(ev, dp_accounting.ComposedDpEvent):
        return sum(_releases(e) for e in ev.events)
    if isinstance(ev, dp_accounting.SelfComposedDpEvent):
        return int(ev.count) * _releases(ev.event)
    return 1


def _sigma(ev: dp_accounting.DpEvent) -> float:
    while not isinstance(ev, dp_accounting.GaussianDpEvent):
        ev = ev.events[0] if isinstance(ev, dp_accounting.ComposedDpEvent) else ev.event
    return float(ev.noise_multiplier)
