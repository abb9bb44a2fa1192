"""When a lock-step program cannot run (`raymm.training.lockstep.fallback`), and that it
never has to where it should not: lock-step is the default and a run that cannot use it says
why once; every lock-step configuration runs the fast path: each lock-step objective x local
optimizer x proximal term x sensor mix (`tools/lockstep_fallbacks.py`'s tiny scenarios, two
rounds) trains every selected device in lock-step, none falling back to the sequential path,
through a closed form where one applies, and ends where the sequential path ends; a round that
counts fallbacks stops a strict run.

Tolerance: 1e-4 absolute on every parameter and round loss, as policies/objective/test_tide.py
holds TIDE's lock-step runs (only float32 summation order, and lock-step Adam's fused kernel,
differ). Strict mode (tests/conftest.py) already turns a fallback into an error; the rows'
`lockstep_fallbacks` are checked besides, as the bench and `round_phases.py` read them.
"""

from __future__ import annotations

import numpy as np
import pytest

import policies.objective.tide_closed_form as tide_closed_form
import raymm.training.lockstep.closed_form as closed_form
from raymm.app.api import run
from raymm.app.build import load_scenario
from raymm.protocol.record import RoundRecord
from raymm.sim.engine import run_round
from raymm.training.lockstep import fallback
from raymm.training.lockstep.fallback import LockstepFallback
from raymm.training.lockstep.trainer import LockstepTrainer

from helpers import REPO, load_script, tiny_scenario

SCRIPT = load_script(REPO / "tools" / "lockstep_fallbacks.py")
TOL = 1e-4

CONFIGS = [(obj, opt, prox, mix, "mlp")
           for obj in SCRIPT.OBJECTIVES for opt in SCRIPT.OPTIMIZERS for prox in (False, True)
           for mix in SCRIPT.MIXES if not (prox and obj == "mcft")]   # MCFT has no such term
# TIDE's closed form with its proximal term behind convolutional encoders (whose gradients
# autograd hands back as views of the grouped convolutions')
CONFIGS += [("tide", opt, True, mix, "cnn1d") for opt in SCRIPT.OPTIMIZERS
            for mix in SCRIPT.MIXES]


def closed_form_expected(objective: str, mix: str) -> bool:
    """TIDE's loss after the encoders always; the bench's chain of `Linear` layers under
    plain cross-entropy where the model has one sensor (`raymm.training.lockstep.closed_form`)."""
    return objective == "tide" or (objective == "ce" and mix == "single")


@pytest.fixture(autouse=True)
def _out_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # run(out=None) writes under ./runs


def _counted(monkeypatch: pytest.MonkeyPatch, owner: object, name: str) -> list[int]:
    calls: list[int] = []
    own = getattr(owner, name)

    def counted(*args, **kwargs):
        calls.append(1)
        return own(*args, **kwargs)
    monkeypatch.setattr(owner, name, counted)
    return calls


@pytest.mark.parametrize("objective,optimizer,prox,mix,encoder", CONFIGS,
                         ids=["-".join([o, opt, "prox" if p else "noprox", m, e])
                              for o, opt, p, m, e in CONFIGS])
def test_every_lockstep_configuration_runs_the_fast_path(monkeypatch, objective, optimizer,
                                                         prox, mix, encoder):
    sc = SCRIPT.scenario(objective, optimizer, prox, mix, encoder, rounds=2)
    programs = _counted(monkeypatch, LockstepTrainer, "_train_chunk")
    closed = _counted(monkeypatch, tide_closed_form.TideClosedForm, "__call__") \
        if objective == "tide" else _counted(monkeypatch, closed_form, "_chain_step")
    vec = run(load_scenario(sc), out=None)
    assert programs and sum(r["lockstep_fallbacks"] for r in vec.rows) == 0
    assert bool(closed) == closed_form_expected(objective, mix)
    sc["execution"]["training"] = {"path": "sequential"}
    seq = run(load_scenario(sc), out=None)
    assert seq.params.keys() == vec.params.keys()
    for g in seq.params:
        np.testing.assert_allclose(vec.params[g], seq.params[g], rtol=0, atol=TOL, err_msg=g)
    np.testing.assert_allclose([r["train_loss"] for r in vec.rows],
                               [r["train_loss"] for r in seq.rows], rtol=0, atol=TOL)


class _Rounds:
    """An executor whose round's record counts fallbacks: the devices trained where strict
    mode did not reach (a Ray worker started without the variable)."""

    def poll(self, t):
        return None

    def plan(self, t, reports):
        return None

    def train(self, t, planned):
        return None

    def aggregate(self, t, planned, results):
        return RoundRecord({"round": t, "lockstep_fallbacks": 3},
                           lockstep_fallbacks={"RuntimeError: vmap refused it": 3})

    def get(self, value):
        return value


def test_a_round_that_counts_fallbacks_stops_a_strict_run(monkeypatch):
    sc = load_scenario(SCRIPT.scenario("ce", "sgd", False, "full", "mlp"))
    with pytest.raises(LockstepFallback, match=r"round 2: .*3 device\(s\): RuntimeError: vmap"):
        run_round(_Rounds(), 2, sc)
    monkeypatch.setenv(fallback.STRICT_VAR, "0")
    assert run_round(_Rounds(), 2, sc).row["lockstep_fallbacks"] == 3


def test_lock_step_is_the_default_and_a_run_that_cannot_use_it_says_why_once(capsys):
    """`execution.training.path` defaults to lock-step; a scenario whose objective does not opt
    in trains sequentially, and the run says so once on stderr, naming the reason."""
    from raymm.config.schema import EngineSpec

    assert EngineSpec().path == "lockstep"
    run(load_scenario(tiny_scenario(rounds=1)), out=None)
    assert "notice" not in capsys.readouterr().err
    run(load_scenario(tiny_scenario(rounds=1, method="fedproto")), out=None)
    err = capsys.readouterr().err
    assert err.count("raymm: notice: devices train sequentially") == 1
    assert "does not declare `vectorisable = True`" in err
