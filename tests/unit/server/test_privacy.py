"""Differential privacy's server half (raymm.server.privacy; docs/methods/privacy.md): checks
that can fail.

1. the empirical std of the server's noise over many rounds is σ·C/D;
2. lock-step runs the devices' mechanism as the sequential path does;
3. raymm's ε is dp-accounting's own for the same parameters (amplified and composed);
4. privacy off gives the non-private run bit for bit, and so does σ = 0, C = ∞ against the
   non-private run with the same arithmetic (delta exchange, unit weights, everyone selected);
and switching TIDE's score-based selection on removes the amplification from the report.
Clipping (the device's half): protocol/test_privacy.py.
"""

from types import SimpleNamespace
from typing import Any

import dp_accounting
import numpy as np
import pytest
import torch
from dp_accounting import rdp
from privacy_audit import Central, Local, ledger, scenario

from raymm.app.api import run
from raymm.app.build import load_scenario
from raymm.config.schema import Scenario
from raymm.errors import ScenarioError
from raymm.protocol.messages import HostResult, RoundPlan, merge_results
from raymm.server.privacy import PrivacyLedger

from helpers import tiny_scenario


def _population(n: int, online: bool = True) -> Any:
    mask = np.ones((n, 1), bool)
    return SimpleNamespace(n=n, sensor_mask=mask, sensors=("a",),
                           online=lambda t, ids: np.full(len(ids), online))


#: what amplification by sampling needs besides a uniform selector: a Poisson cohort drawn from
#: a secret stream
SECRET_POISSON: dict[str, Any] = {"sampling": "poisson", "selection_secret": 20261207}


def _ledger(n: int = 100, k: int = 10, sizes: dict[str, int] | None = None,
            selection: str = "random", **privacy: Any) -> PrivacyLedger:
    sc = Scenario.model_validate({"name": "p", "rounds": 50,
                                  "selection": {"name": selection, "k": k},
                                  "privacy": {"mode": "central", **privacy}})
    joint = SimpleNamespace(eligible=lambda t, mask, sensors: np.ones(len(mask), bool))
    return PrivacyLedger(sc, _population(n), sizes or {"shared": 4}, schedule=joint)


def _batch(rows: np.ndarray, ids: np.ndarray) -> Any:
    r = HostResult(ids, np.full(len(ids), 7), np.zeros(len(ids)), np.zeros(len(ids)),
                   {"shared": rows.astype(np.float32)}, {"shared": np.arange(len(ids))})
    return merge_results([r])


def test_noise_std_is_sigma_c_over_denominator():
    sigma, clip, size, rounds = 1.3, 0.7, 2000, 60
    led = _ledger(sizes={"shared": size}, noise_multiplier=sigma, clip=clip)
    ids = np.arange(10)
    plan = RoundPlan(1, ids, ("shared",))
    zero = {"shared": np.zeros(size, np.float32)}
    noise = []
    for t in range(1, rounds + 1):  # the updates sum to zero: what is left is the noise
        out = led.release(t, plan, zero, _batch(np.zeros((10, size)), ids))
        noise.append(out.means["shared"])
    noise = np.concatenate(noise).astype(np.float64)
    want = sigma * clip / led.denominators["shared"]
    assert led.denominators["shared"] == 10  # min(k, N): fixed, not the realised count
    assert abs(noise.std() / want - 1) < 0.01  # 120,000 draws: the std's error is 0.2%
    assert abs(noise.mean()) < 4 * want / np.sqrt(noise.size)
    # the same seed gives the same noise: a resumed or Ray run draws the same numbers
    again = _ledger(sizes={"shared": size}, noise_multiplier=sigma, clip=clip).release(
        rounds, plan, zero, _batch(np.zeros((10, size)), ids))
    np.testing.assert_array_equal(again.means["shared"], out.means["shared"])


def test_denominator_does_not_follow_the_realised_count():
    led = _ledger(noise_multiplier=0.0, clip=100.0)
    plan = RoundPlan(1, np.arange(3), ("shared",))
    rows = np.ones((3, 4))
    out = led.release(1, plan, {"shared": np.zeros(4, np.float32)},
                      _batch(rows, np.arange(3)))
    np.testing.assert_allclose(out.means["shared"], 3 / 10)  # 3 senders over D = 10


@pytest.mark.parametrize("mode", ["central", "local"])
def test_lock_step_runs_the_same_mechanism_as_sequential(mode):
    """Lock-step (the default) clips and noises each device's update as the sequential path
    does: the same noise streams, so the two runs agree to float32 rounding; a private run
    that skipped the mechanism on either path would be far off (σ·C = 0.025 a coordinate)."""
    dp = {"privacy": {"mode": mode, "noise_multiplier": 0.5, "clip": 0.05}}
    out = "/tmp/raymm_test_privacy"
    fast = run(tiny_scenario(**dp, **{"execution.training.path": "lockstep"}), out=out)
    slow = run(tiny_scenario(**dp, **{"execution.training.path": "sequential"}), out=out)
    plain = run(tiny_scenario(**{"execution.training.path": "lockstep"}), out=out)
    a, b, c = _params(fast), _params(slow), _params(plain)
    for g in b:
        np.testing.assert_allclose(a[g], b[g], rtol=0, atol=1e-5)
    assert max(float(np.abs(a[g] - c[g]).max()) for g in c) > 1e-3


def test_epsilon_is_the_librarys():
    sigma, q, rounds, delta = 1.1, 0.1, 40, 1e-5
    led = _ledger(n=100, k=10, noise_multiplier=sigma, delta=delta, **SECRET_POISSON)
    for t in range(1, rounds + 1):
        led.planned(t, np.arange(100), np.arange(10), True)
        row = led.account(t)
    acc = rdp.RdpAccountant()
    acc.compose(dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), rounds))
    assert row["privacy/epsilon"] == acc.get_epsilon(delta)
    assert row["privacy/sampling_rate"] == q
    # every device's ε is the run's under amplification
    assert (led.device_epsilon() == row["privacy/epsilon"]).all()
    # composed (no amplification): every participation a Gaussian mechanism
    led = _ledger(n=100, k=10, noise_multiplier=sigma, delta=delta, selection="tide")
    for t in range(1, rounds + 1):
        led.planned(t, np.arange(100), np.arange(10), True)
        row = led.account(t)
    acc = rdp.RdpAccountant()
    acc.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(sigma),
                                                  rounds))
    assert row["privacy/epsilon"] == acc.get_epsilon(delta)


def test_participation_bound_tightens_the_composed_epsilon():
    led = _ledger(n=20, k=5, noise_multiplier=2.0, selection="tide", max_participation=3)
    for t in range(1, 11):  # every device eligible for all 10 releases, but capped at 3
        eligible = led.eligible(np.arange(20))
        sel = eligible[:5]
        led.planned(t, eligible, sel, True)
        row = led.account(t)
    assert row["privacy/compositions"] == 3
    assert led.selected_count.max() == 3
    acc = rdp.RdpAccountant()
    acc.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(2.0), 3))
    assert row["privacy/epsilon"] == acc.get_epsilon(led.delta)


def test_calibrated_sigma_meets_the_target():
    led = _ledger(n=100, k=10, target_epsilon=4.0, on_target="calibrate", delta=1e-5,
                  **SECRET_POISSON)
    assert led.sigma > 0
    acc = rdp.RdpAccountant()
    acc.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(
        0.1, dp_accounting.GaussianDpEvent(led.sigma)), 50))
    assert 3.95 < acc.get_epsilon(1e-5) <= 4.0


def _seconds_ledger(leaves: bool) -> PrivacyLedger:
    """Calibration on the seconds clock, with a round-indexed clock that says 'offline' (it
    must not be read: the releases' instants are not known before the run)."""
    sc = Scenario.model_validate({"name": "p", "rounds": 50, "clock": {"mode": "seconds"},
                                  "selection": {"name": "random", "k": 10},
                                  "privacy": {"mode": "central", "target_epsilon": 4.0,
                                              "on_target": "calibrate", "delta": 1e-5,
                                              **SECRET_POISSON}})
    pop = _population(100, online=False)
    end = 600.0 if leaves else np.inf
    pop.availability = SimpleNamespace(departure=lambda s, ids: np.full(len(ids), end))
    joint = SimpleNamespace(eligible=lambda t, mask, sensors: np.ones(len(mask), bool))
    return PrivacyLedger(sc, pop, {"shared": 4}, schedule=joint)


def test_seconds_clock_calibration_amplifies_only_when_nobody_leaves():
    stays, leaves = _seconds_ledger(leaves=False), _seconds_ledger(leaves=True)
    amplified, composed = rdp.RdpAccountant(), rdp.RdpAccountant()
    amplified.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(
        0.1, dp_accounting.GaussianDpEvent(stays.sigma)), 50))
    # a device that may leave: no amplification, and every release counts for it
    composed.compose(dp_accounting.SelfComposedDpEvent(
        dp_accounting.GaussianDpEvent(leaves.sigma), 50))
    assert 3.95 < amplified.get_epsilon(1e-5) <= 4.0
    assert 3.95 < composed.get_epsilon(1e-5) <= 4.0
    assert leaves.sigma > stays.sigma


def _always_on(**over: Any) -> dict[str, Any]:
    return tiny_scenario(**{"population.availability": [{"pattern": "always"}], **over})


def test_tide_selection_removes_the_amplification():
    dp = {"mode": "central", "noise_multiplier": 1.0, "clip": 0.5, **SECRET_POISSON}
    uniform = run(_always_on(privacy=dp), out="/tmp/raymm_test_privacy")
    scored = run(_always_on(privacy={**dp, "sampling": "fixed"}, **{"selection.name": "tide"}),
                 out="/tmp/raymm_test_privacy")
    a, b = uniform.summary["privacy"], scored.summary["privacy"]
    assert a["sampling_rate"] == 5 / 12 and "Poisson" in a["assumption"]
    assert b["sampling_rate"] == 0.0 and "no amplification" in b["assumption"]
    assert "'tide'" in b["assumption"]
    assert b["epsilon"] > a["epsilon"]
    # availability clocks (half the devices periodic) remove it too, even for random selection
    clocks = run(tiny_scenario(privacy=dp), out="/tmp/raymm_test_privacy")
    assert "no amplification" in clocks.summary["privacy"]["assumption"]
    # and so does a selection anyone can replay from config.yaml's seed, or a fixed-size draw
    public = {k: v for k, v in dp.items() if k != "selection_secret"}
    replayable = run(_always_on(privacy=public), out="/tmp/raymm_test_privacy")
    assert "published seed" in replayable.summary["privacy"]["assumption"]
    fixed = run(_always_on(privacy={**dp, "sampling": "fixed"}), out="/tmp/raymm_test_privacy")
    assert "fixed-size cohort" in fixed.summary["privacy"]["assumption"]
    assert replayable.summary["privacy"]["epsilon"] == fixed.summary["privacy"]["epsilon"] \
        == b["epsilon"] > a["epsilon"]
    # the secret is nowhere in the run's files
    for res in (uniform, replayable):
        for f in res.run_dir.rglob("*"):
            if f.is_file() and f.suffix in (".yaml", ".json", ".csv", ".md", ".txt"):
                assert str(SECRET_POISSON["selection_secret"]) not in f.read_text(), f


def _params(res: Any) -> dict[str, np.ndarray]:
    return {g: np.asarray(v) for g, v in res.params.items()}


def _same_run(a: Any, b: Any) -> None:
    """Every parameter equal bit for bit (torch.equal), every evaluation equal."""
    pa, pb = _params(a), _params(b)
    assert pa.keys() == pb.keys()
    for g in pa:
        assert torch.equal(torch.from_numpy(pa[g]), torch.from_numpy(pb[g])), g
    acc = [[r["accuracy"] for r in res.rows if "accuracy" in r] for res in (a, b)]
    assert acc[0] and acc[0] == acc[1]


def test_privacy_off_is_bit_for_bit():
    base = run(tiny_scenario(), out="/tmp/raymm_test_privacy")
    off = run(tiny_scenario(privacy={"mode": "off", "clip": 3.0}),
              out="/tmp/raymm_test_privacy")
    _same_run(base, off)


#: the non-private run whose arithmetic is the private mechanism's at σ = 0, C = ∞: deltas
#: exchanged and averaged (`delta_mean`), every device online and selected (the realised
#: count is the fixed denominator D = 12), and 32 samples each (a power of two: weighting by
#: sample count scales every product and partial sum by 32 exactly, and (32·S)/(32·12) rounds
#: as S/12 does, so sample weights are unit weights in floating point)
SAME_ARITHMETIC = {"population.availability": [{"pattern": "always"}],
                   "population.partition": {"kind": "iid"}, "selection.k": 12,
                   "dataset.n_train": 384, "training.exchange": "delta",
                   "aggregation.name": "delta_mean", "rounds": 4, "eval.every": 1}


def test_sigma0_cinf_is_the_non_private_run_bit_for_bit():
    """σ = 0, C = ∞: the private path (clip nothing, sum with unit weights, no noise, divide
    by D) against the non-private run with the same arithmetic: equal bit for bit."""
    nil_dp = {"mode": "central", "noise_multiplier": 0.0, "clip": None}
    plain = run(tiny_scenario(**SAME_ARITHMETIC), out="/tmp/raymm_test_privacy")
    nil = run(tiny_scenario(privacy=nil_dp, **SAME_ARITHMETIC), out="/tmp/raymm_test_privacy")
    assert nil.summary["privacy"]["epsilon"] == float("inf")
    assert [r["privacy/releases"] for r in nil.rows] == [1, 2, 3, 4]
    _same_run(plain, nil)
    # the check can fail: 400 samples (33 or 34 a device) make sample weights differ from
    # the private path's unit weights, and the models differ
    uneven = {**SAME_ARITHMETIC, "dataset.n_train": 400}
    a = _params(run(tiny_scenario(**uneven), out="/tmp/raymm_test_privacy"))
    b = _params(run(tiny_scenario(privacy=nil_dp, **uneven), out="/tmp/raymm_test_privacy"))
    assert any(not np.array_equal(a[g], b[g]) for g in a)
    # exchanging parameters, FedAvg computes mean(θ_i) and the private path θ + mean(θ_i − θ):
    # the same number in exact arithmetic, not the same float operations (within 1e-6)
    params = {**SAME_ARITHMETIC, "training.exchange": "params", "aggregation.name": "fedavg"}
    a = _params(run(tiny_scenario(**params), out="/tmp/raymm_test_privacy"))
    b = _params(run(tiny_scenario(privacy=nil_dp, **params), out="/tmp/raymm_test_privacy"))
    for g, v in a.items():
        np.testing.assert_allclose(b[g], v, rtol=0, atol=1e-6)


def test_validation_refuses_what_the_mechanism_does_not_cover():
    dp = {"mode": "central", "noise_multiplier": 1.0}
    with pytest.raises(ScenarioError, match="reads every device's row"):
        load_scenario(tiny_scenario(privacy=dp, **{"aggregation.name": "trimmed_mean"}))
    with pytest.raises(ScenarioError, match="lambda_p"):
        load_scenario(tiny_scenario(privacy=dp, method="tide"))
    with pytest.raises(ScenarioError, match="noise_multiplier"):
        load_scenario(tiny_scenario(privacy={"mode": "central"}))
    with pytest.raises(ScenarioError, match="clip: null"):
        load_scenario(tiny_scenario(privacy={"mode": "central", "noise_multiplier": 1.0,
                                             "clip": None}))
    ok = load_scenario(tiny_scenario(privacy=dp, method="tide",
                                     **{"objective.lambda_p": 0.0}))
    assert ok.privacy.on


def test_default_delta_is_below_one_over_n_squared_and_1e_5():
    from raymm.server.privacy import default_delta
    assert default_delta(100) == 1e-5          # 1/N² = 1e-4: the ceiling decides
    assert default_delta(1000) == 1e-6         # 1/N² decides
    assert _ledger(n=100, noise_multiplier=1.0).delta == 1e-5


CALIBRATIONS = {"sigma": {"noise_multiplier": 1.5},
                "calibrate": {"target_epsilon": 4.0, "on_target": "calibrate"},
                "stop": {"noise_multiplier": 1.5, "target_epsilon": 4.0, "on_target": "stop"}}
CLIPPINGS = {"fixed": {"clip": 0.5}, "adaptive": {"clip": 0.5, "adaptive_clip": True},
             "none": {"clip": None}}


@pytest.mark.parametrize("mode", ["central", "local"])
@pytest.mark.parametrize("calibration", sorted(CALIBRATIONS))
@pytest.mark.parametrize("clipping", sorted(CLIPPINGS))
def test_every_mode_calibration_and_clipping_works_or_is_refused(mode, calibration, clipping):
    """Each combination either validates and then noises as the ledger accounts (the upload
    of local mode, the release of central mode, carry noise of σ·C with the σ the ledger
    reports), or is refused with a message naming the setting."""
    privacy = {"mode": mode, **CALIBRATIONS[calibration], **CLIPPINGS[clipping]}
    refused = (clipping == "none") or (mode == "local" and clipping == "adaptive")
    if refused:
        with pytest.raises(ValueError, match="privacy") as err:
            Scenario.model_validate({"name": "p", "rounds": 3, "privacy": privacy})
        assert ("clip: null" in str(err.value)) or ("adaptive_clip needs mode: central"
                                                   in str(err.value))
        return
    world = Local(privacy, a=0.0, b=0.0) if mode == "local" else Central(privacy, n=2, k=2)
    scores = world.scores(True, 400, seed=3)  # the canary's update is 0 in local mode
    led = ledger(scenario(privacy, world.n, world.n if mode == "local" else 2, seed=3), world.n)
    assert led.sigma > 0 and np.isfinite(led.epsilon(1))
    if clipping == "adaptive":  # C moves every release: the noise is there, its scale moves
        assert scores.std() > 0
        return
    # the scores are the noise: its std is σ·C (local, on the upload) or σ·C/D (central)
    want = led.sigma * 0.5 if mode == "local" else led.sigma * 0.5 / 2
    if mode == "central":
        scores = scores - 0.5 / 2  # the canary's clipped update, over D = 2
    assert abs(scores.std() / want - 1) < 0.15 and abs(scores.mean()) < 4 * want / 20
