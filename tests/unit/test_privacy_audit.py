"""A privacy test that attacks (tests/privacy_audit.py): the ε an attacker can prove from
seeded repetitions never exceeds the ε raymm reports, in central and in local mode, and the
same attack catches each of four faults when it is put back:

1. local DP with a solved σ whose devices add no noise (they read the scenario's unset σ);
2. local DP devices that send whether their update was within C, in the clear;
3. local DP accounted at sensitivity C (a device's two inputs are 2C apart);
4. amplification by sampling claimed for a cohort drawn from the published seed.

Each faulty variant is the earlier code's behaviour, patched in for the test alone.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from privacy_audit import Central, Local, audit, ledger, reported_epsilon, scenario

from raymm.protocol import privacy as device_privacy
from raymm.server import privacy as server_privacy
from raymm.server.privacy import PrivacyLedger

DELTA = 1e-5
#: local mode at a given σ: 2.0 puts the true ε (sensitivity 2C) well above what sensitivity
#: C would report, within reach of the attack's 40,000 releases a world
LOCAL = {"mode": "local", "noise_multiplier": 2.0, "clip": 1.0, "delta": DELTA,
         "accountant": "pld"}
#: local mode with σ solved for ε = 1 over one release
LOCAL_TARGET = {"mode": "local", "target_epsilon": 1.0, "on_target": "calibrate",
                "clip": 1.0, "delta": DELTA, "accountant": "pld"}
#: central mode, both devices in every release (composed)
CENTRAL = {"mode": "central", "noise_multiplier": 1.0, "clip": 1.0, "delta": DELTA,
           "accountant": "pld"}
#: a Poisson cohort of q = 0.1 (k = 1 of 10 devices)
POISSON = {**CENTRAL, "noise_multiplier": 2.0, "sampling": "poisson"}
SECRET = 987654321


def _reported(privacy: dict[str, Any], n: int, k: int) -> float:
    return reported_epsilon(scenario(privacy, n, k, seed=1), n)


# --- the faults, as the earlier code had them -------------------------------------------
def _devices_read_the_scenario_sigma(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fault 1: the device noises with the scenario's σ, unset under a target ε: no noise."""
    real = device_privacy.privatize

    def privatize(spec: Any, seed: int, rnd: int, device: int, sent: Any, start: Any,
                  clip: Any, bounds: Any, sigma: float | None = None) -> Any:
        return real(spec, seed, rnd, device, sent, start, clip, bounds,
                    spec.noise_multiplier or 0.0)
    monkeypatch.setattr("privacy_audit.privatize", privatize)


def _bit_in_the_clear(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fault 2: every device sends its clipping bit, adaptive clipping or not."""
    real = device_privacy.privatize

    def privatize(spec: Any, *args: Any, **kw: Any) -> Any:
        return real(spec.model_copy(update={"adaptive_clip": True}), *args, **kw)
    monkeypatch.setattr("privacy_audit.privatize", privatize)


def _local_sensitivity_c(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fault 3: local DP accounted as if one device's input moved its upload by C."""
    monkeypatch.setitem(server_privacy.SENSITIVITY, "local", 1.0)


def _amplified_without_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fault 4: a uniform central draw is amplified whatever seed it came from."""
    monkeypatch.setattr(PrivacyLedger, "_why_not_amplified", lambda self: None)


# --- no fault: the attack stays below what is reported ------------------------------------
def test_central_mode_attack_stays_below_the_reported_epsilon():
    lb = audit(Central(CENTRAL, n=2, k=2), trials=6000, delta=DELTA)
    reported = _reported(CENTRAL, 2, 2)
    assert 1.0 < lb <= reported, (lb, reported)  # the attack has power, and finds no leak


def test_local_mode_attack_stays_below_the_reported_epsilon():
    lb = audit(Local(LOCAL), trials=40_000, delta=DELTA)
    reported = _reported(LOCAL, 1, 1)
    assert 1.5 < lb <= reported, (lb, reported)
    # a solved σ too: the devices add it
    lb = audit(Local(LOCAL_TARGET), trials=4000, delta=DELTA)
    assert lb <= _reported(LOCAL_TARGET, 1, 1) == pytest.approx(1.0, abs=1e-3)
    # and inputs inside and outside C, which a clipping bit would tell apart
    assert audit(Local(LOCAL, a=0.5, b=3.0), trials=4000, delta=DELTA) <= \
        _reported(LOCAL, 1, 1)


def test_secret_poisson_cohort_attack_stays_below_the_amplified_epsilon():
    """With the secret, replaying the draw from the published seed tells the attacker
    nothing: its bound stays below the amplified ε."""
    secret = {**POISSON, "selection_secret": SECRET}
    lb = audit(Central(secret, n=10, k=1, replay=True), trials=40_000, delta=DELTA)
    reported = _reported(secret, 10, 1)
    assert lb <= reported < _reported({**POISSON, "sampling": "fixed"}, 10, 1)


# --- each fault, put back, is caught ----------------------------------------------------
def test_attack_catches_local_devices_without_noise(monkeypatch):
    _devices_read_the_scenario_sigma(monkeypatch)
    lb = audit(Local(LOCAL_TARGET), trials=4000, delta=DELTA)
    assert lb > 3 * _reported(LOCAL_TARGET, 1, 1), lb


def test_attack_catches_the_clipping_bit_in_the_clear(monkeypatch):
    _bit_in_the_clear(monkeypatch)
    lb = audit(Local(LOCAL, a=0.5, b=3.0), trials=4000, delta=DELTA)
    assert lb > _reported(LOCAL, 1, 1), lb


def test_attack_catches_local_sensitivity_c(monkeypatch):
    honest = _reported(LOCAL, 1, 1)
    _local_sensitivity_c(monkeypatch)
    faulty = _reported(LOCAL, 1, 1)
    lb = audit(Local(LOCAL), trials=40_000, delta=DELTA)
    assert faulty < lb <= honest, (faulty, lb, honest)


def test_attack_catches_amplification_from_the_published_seed(monkeypatch):
    _amplified_without_secret(monkeypatch)
    faulty = _reported(POISSON, 10, 1)
    lb = audit(Central(POISSON, n=10, k=1, replay=True), trials=40_000, delta=DELTA)
    assert lb > faulty, (lb, faulty)


def test_the_faults_are_gone():
    """The settings the faults lived in, as raymm now reports and runs them."""
    # 1: a local device gets the solved σ from the server and adds it
    sc = scenario(LOCAL_TARGET, 1, 1, seed=1)
    extras = ledger(sc, 1).extras()
    assert extras[device_privacy.NOISE][0] > 0
    sent, bits = device_privacy.privatize(sc.privacy, 1, 1, 0, {"shared": np.zeros(4)}, None,
                                          1.0, None, float(extras[device_privacy.NOISE][0]))
    assert np.abs(sent["shared"]).sum() > 0
    # 2: nothing besides the update
    assert bits == {}
    # 3: sensitivity 2C: the local ε is that of σ/2
    assert server_privacy.SENSITIVITY["local"] == 2.0
    # 4: no secret, no amplification
    assert _reported(POISSON, 10, 1) == _reported({**POISSON, "sampling": "fixed"}, 10, 1)
