"""ε of a run's releases (raymm.server.accounting): dp-accounting's own numbers for the
amplified and the composed events, 0 without releases, ∞ without noise, and a calibrated σ
that meets its target."""

from __future__ import annotations

import math

import dp_accounting
import pytest
from dp_accounting import rdp

from raymm.server.accounting import accountant, calibrate, epsilon, event


def test_epsilon_is_the_librarys_for_both_compositions() -> None:
    delta = 1e-5
    amplified = event(1.1, {0.1: 40, 0.05: 10})
    direct = rdp.RdpAccountant()
    gauss = dp_accounting.GaussianDpEvent(1.1)
    direct.compose(dp_accounting.ComposedDpEvent([
        dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(0.05, gauss), 10),
        dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(0.1, gauss), 40)]))
    assert epsilon("rdp", amplified, delta) == pytest.approx(direct.get_epsilon(delta))
    composed = rdp.RdpAccountant()
    composed.compose(dp_accounting.SelfComposedDpEvent(gauss, 7))
    assert epsilon("rdp", event(1.1, count=7), delta) == \
        pytest.approx(composed.get_epsilon(delta))
    # PLD is the tighter accountant: never above RDP
    assert epsilon("pld", event(1.1, count=7), delta) <= epsilon("rdp", event(1.1, count=7),
                                                                 delta)


def test_no_release_costs_nothing_and_no_noise_everything() -> None:
    assert epsilon("rdp", event(1.0, count=0), 1e-5) == 0.0
    assert epsilon("rdp", event(0.0, count=3), 1e-5) == math.inf
    with pytest.raises(ValueError, match="unknown accountant 'moments'"):
        accountant("moments")


@pytest.mark.parametrize("kind", ["rdp", "pld"])
def test_the_calibrated_sigma_meets_the_target_and_no_smaller_one_does(kind: str) -> None:
    def make(sigma: float) -> dp_accounting.DpEvent:
        return event(sigma, count=10)

    sigma = calibrate(kind, make, 2.0, 1e-5)
    assert epsilon(kind, make(sigma), 1e-5) <= 2.0
    assert epsilon(kind, make(sigma * 0.99), 1e-5) > 2.0
