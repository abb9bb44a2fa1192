"""TIDE's objective trains in lock-step (raymm.training.lockstep) and agrees with the sequential
path.

Tolerance: 1e-4 absolute on every parameter after four rounds with prototypes, aux heads,
L_cs, modality dropout, the adapter and padded last batches (observed ~1e-7: only float32
summation order differs).
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from torch.func import vmap

from policies.objective.tide import TideObjective, TideObjectiveParams
from raymm.app.api import run
from raymm.app.build import build_world, load_scenario
from raymm.device.lockstep_host import LockstepHost, make_host
from raymm.models.network import ModelOutput
from raymm.protocol.seams import LossInputs

from helpers import tiny_scenario

TOL = 1e-4


def _scenario(path: str, adapter_path: str = "personal", mu: float = 0.01) -> dict:
    # batch 7: most devices end an epoch on a padded batch; warm-up 1: prototypes from round 2
    return tiny_scenario(**{"method": "tide", "rounds": 4, "training.lr": 0.01,
                            "training.batch_size": 7, "execution.training.path": path,
                            "aggregation": {"name": "tide", "warmup": 1},
                            "objective.adapter_path": adapter_path, "objective.mu": mu})


@pytest.fixture(autouse=True)
def _out_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # run(out=None) writes under ./runs


# mu 3: lock-step Adam adds the proximal term outside the loss (`LockstepAdam`), and there it
# moves the parameters by far more than the tolerance
@pytest.mark.parametrize("adapter_path,mu", [("personal", 0.01), ("joint", 0.01),
                                             ("personal", 3.0)])
def test_tide_lockstep_matches_sequential(caplog, adapter_path, mu):
    sc = load_scenario(_scenario("lockstep", adapter_path, mu))
    world = build_world(sc)
    host = make_host(np.arange(world.population.n), world.population, world.dataset,
                     world.host_spec)
    assert isinstance(host, LockstepHost) and host.reason is None and host.lockstep is not None
    seq = run(load_scenario(_scenario("sequential", adapter_path, mu)), out=None)
    with caplog.at_level(logging.WARNING, logger="raymm.training.lockstep"):
        vec = run(sc, out=None)
    # no bucket fell back to sequential training
    assert "failed" not in caplog.text and "sequentially" not in caplog.text
    assert seq.params.keys() == vec.params.keys()
    for g in seq.params:
        np.testing.assert_allclose(vec.params[g], seq.params[g], rtol=0, atol=TOL, err_msg=g)
    np.testing.assert_allclose([r["train_loss"] for r in vec.rows],
                               [r["train_loss"] for r in seq.rows], atol=TOL)


def _inputs(weight, b: int = 6, c: int = 4, present=None) -> LossInputs:
    g = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    out = ModelOutput(logits=r(b, c), z=r(b, 5), embeddings={"a": r(b, 3), "b": r(b, 3)},
                      sensor_logits={"a": r(b, c), "b": r(b, c)}, z_base=r(b, 5))
    y = torch.tensor([0, 1, 2, 3, 0, 2][:b])
    extras = {"prototypes": r(c, 5), "prototype_mask": torch.tensor([1.0, 0.0, 1.0, 1.0])}
    w = {"w": r(3)}
    return LossInputs(out, y, torch.ones(b, 2) if present is None else present, ("a", "b"),
                      w, {"w": w["w"] + 0.1}, extras, 3, weight=weight)


def _loss(inp: LossInputs) -> torch.Tensor:
    return TideObjective(TideObjectiveParams(mu=0.5)).loss(inp)


def test_all_ones_weight_is_the_sequential_loss():
    assert TideObjective.vectorisable
    ref = _loss(_inputs(None))
    torch.testing.assert_close(_loss(_inputs(torch.ones(6))), ref, rtol=0, atol=1e-6)


def _pad(inp: LossInputs, k: int, present_pad: float = 1.0) -> LossInputs:
    """`inp` with k junk rows appended, weight 0."""
    g = torch.Generator().manual_seed(1)
    cat = lambda t: torch.cat([t, 10 * torch.randn((k,) + t.shape[1:], generator=g)])  # noqa
    o = inp.out
    out = ModelOutput(cat(o.logits), cat(o.z), {m: cat(e) for m, e in o.embeddings.items()},
                      {m: cat(s) for m, s in o.sensor_logits.items()}, cat(o.z_base))
    y = torch.cat([inp.y, torch.tensor([1] * k)])
    present = torch.cat([inp.present, torch.full((k, 2), present_pad)])
    weight = torch.cat([torch.ones(inp.y.shape[0]), torch.zeros(k)])
    return LossInputs(out, y, present, inp.held, inp.trainable, inp.anchor, inp.extras,
                      inp.round, weight=weight)


def test_padding_rows_do_not_change_the_loss_or_its_terms():
    ref = _loss(_inputs(None, b=4))
    torch.testing.assert_close(_loss(_pad(_inputs(None, b=4), 3)), ref, rtol=0, atol=1e-5)
    # a sensor dropped in the real rows but "present" on padding still counts as dropped
    dropped = torch.tensor([[1.0, 0.0]] * 4)
    ref = _loss(_inputs(None, b=4, present=dropped))
    torch.testing.assert_close(_loss(_pad(_inputs(None, b=4, present=dropped), 3)), ref,
                               rtol=0, atol=1e-5)
    # and padding rows marked absent do not drop a sensor the real rows have
    ref = _loss(_inputs(None, b=4))
    torch.testing.assert_close(_loss(_pad(_inputs(None, b=4), 3, present_pad=0.0)), ref,
                               rtol=0, atol=1e-5)


def test_loss_vmaps_over_devices_with_different_dropout():
    """Two devices in one bucket, one with sensor b dropped: each gets its own loss."""
    both, drop = _pad(_inputs(None, b=4), 2), _pad(_inputs(None, b=4), 2)
    drop_present = drop.present.clone()
    drop_present[:4, 1] = 0.0
    f = lambda pr, w: _loss(LossInputs(both.out, both.y, pr, both.held, both.trainable,  # noqa
                                       both.anchor, both.extras, 3, weight=w))
    got = vmap(f)(torch.stack([both.present, drop_present]), torch.stack([both.weight] * 2))
    torch.testing.assert_close(got[0], _loss(_inputs(None, b=4)), rtol=0, atol=1e-5)
    torch.testing.assert_close(
        got[1], _loss(_inputs(None, b=4, present=torch.tensor([[1.0, 0.0]] * 4))),
        rtol=0, atol=1e-5)
    assert not torch.isclose(got[0], got[1])
