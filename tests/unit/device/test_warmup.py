"""`raymm.device.warmup.warm_up` takes the first lock-step call's one-time costs out of round 1 and
changes nothing a run computes: the module's weights, the host's device state and the global
torch random state are as before, and a warmed-up host trains bit for bit like a cold one."""

from __future__ import annotations

import numpy as np
import torch

from raymm.app.build import build_world, load_scenario
from raymm.device.lockstep_host import make_host
from raymm.device.warmup import warm_up
from raymm.protocol.messages import Broadcast, RoundPlan
from raymm.server.server import Server

from helpers import tiny_scenario


def _hosts_and_round(**overrides: object) -> tuple:
    sc = load_scenario(tiny_scenario(**{"execution.training.path": "lockstep", "method": "tide",
                                        **overrides}))
    world = build_world(sc)
    ids = np.arange(world.population.n)
    cold, warm = (make_host(ids, world.population, world.dataset, world.host_spec)
                  for _ in range(2))
    server = Server(sc, world.dataset, world.population, world.policies)
    plan = RoundPlan(1, np.array([0, 3, 4, 7, 9, 11]), tuple(server.layout.groups))
    return cold, warm, plan, Broadcast(1, server.params, {})


def test_warm_up_leaves_weights_state_and_random_stream_alone() -> None:
    _, host, _, _ = _hosts_and_round()
    assert host.lockstep is not None, "the tiny TIDE scenario should train in lock-step"
    model = host.trainer.model
    weights = {n: p.detach().clone() for n, p in model.named_parameters()}
    rng = torch.get_rng_state()
    warm_up(host)
    assert torch.equal(torch.get_rng_state(), rng)
    assert host.states == {}
    for n, p in model.named_parameters():
        assert torch.equal(p, weights[n]), n
        assert p.grad is None, n


def test_warmed_up_host_trains_like_a_cold_one() -> None:
    cold, warm, plan, bcast = _hosts_and_round()
    warm_up(warm)
    a, b = cold.train(plan, bcast), warm.train(plan, bcast)
    assert a.device_ids.tolist() == b.device_ids.tolist() and a.device_ids.size > 0
    assert np.array_equal(a.loss, b.loss)
    for g in a.updates:
        assert np.array_equal(a.updates[g], b.updates[g]), g
    assert a.states  # TIDE devices keep adapters
    np.testing.assert_equal(a.states, b.states)  # nested records, exactly


def test_warm_up_works_on_a_sequential_host() -> None:
    """A host that trains one device at a time (no lock-step trainer) warms up too."""
    cold, warm, plan, bcast = _hosts_and_round(**{"execution.training.path": "sequential"})
    warm_up(warm)
    assert np.array_equal(cold.train(plan, bcast).loss, warm.train(plan, bcast).loss)


def test_warm_up_transforms_leaves_the_random_stream_alone() -> None:
    from raymm.device.warmup import warm_up_transforms

    rng = torch.get_rng_state()
    warm_up_transforms()
    assert torch.equal(torch.get_rng_state(), rng)
