"""The device's half of differential privacy (raymm.protocol.privacy): no device's contribution
exceeds C after clipping (the whole update and per group, by hand and in a run), and the
upload is the clipped change from where the device started."""

from typing import Any

import numpy as np

from raymm.app.api import run
from raymm.config.schema import Scenario
from raymm.protocol.privacy import clip_update, group_bounds, privatize

from helpers import tiny_scenario


def test_no_contribution_exceeds_c_after_clipping():
    gen = np.random.default_rng(0)
    for scale in (1e-3, 1.0, 1e3):
        upd = {"shared": gen.normal(0, scale, 5000), "sensor:a": gen.normal(0, scale, 300)}
        clipped, norm, within = clip_update(upd, 0.5)
        joint = np.sqrt(sum(float(np.dot(v.astype(np.float64), v)) for v in clipped.values()))
        assert joint <= 0.5
        assert within == (norm <= 0.5)
        shares = group_bounds(1.0, {"shared": 5000, "sensor:a": 300, "sensor:b": 300}, "size")
        per, _, _ = clip_update(upd, 0.5, shares)
        for g, v in per.items():
            assert np.linalg.norm(v.astype(np.float64)) <= 0.5 * shares[g]
        assert np.sqrt(sum(float(np.dot(v.astype(np.float64), v))
                           for v in per.values())) <= 0.5
    # the device's upload is the clipped change from where it started
    start = {"shared": np.full(10, 2.0, np.float32)}
    sent = {"shared": np.full(10, 12.0, np.float32)}
    spec = Scenario.model_validate({"name": "p", "rounds": 1, "privacy": {
        "mode": "central", "noise_multiplier": 1.0, "clip": 1.0}}).privacy
    up, extra = privatize(spec, 0, 1, 3, sent, start, 1.0, None)
    assert np.linalg.norm(up["shared"].astype(np.float64)) <= 1.0
    assert extra == {}  # nothing besides the update without adaptive clipping
    adaptive = spec.model_copy(update={"adaptive_clip": True})
    assert privatize(adaptive, 0, 1, 3, sent, start, 1.0, None)[1]["privacy/unclipped"] == 0.0


def test_contributions_in_a_run_stay_within_c(monkeypatch):
    """In a whole run, every row a host hands over is within C (captured before pre-summing)."""
    from raymm.device import host as host_mod
    norms: list[float] = []
    real = host_mod.privacy.privatize

    def spy(*a: Any, **kw: Any) -> Any:
        up, extra = real(*a, **kw)
        norms.append(float(np.sqrt(sum(float(np.dot(v.astype(np.float64), v))
                                       for v in up.values()))))
        return up, extra

    monkeypatch.setattr(host_mod.privacy, "privatize", spy)
    run(tiny_scenario(**{"privacy": {"mode": "central", "noise_multiplier": 0.5,
                                     "clip": 0.05}}), out="/tmp/raymm_test_privacy")
    assert norms and max(norms) <= 0.05
