"""M3Fed's local update (policies.objective.m3fed): the Hessian-free Per-FedAvg meta step by
hand on L(θ) = θ², through the trainer's own `LocalUpdate.run`; clipping; how minibatches
group into steps; the consensus term of the loss; lock-step declines the rule."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from policies.objective.m3fed import CONSENSUS, M3FedLoss, M3FedLossParams, triples
from raymm.config.schema import TrainingSpec
from raymm.models.network import ModelOutput
from raymm.protocol.seams import LossInputs
from raymm.training.local_update import LocalUpdate
from raymm.training.lockstep.fallback import why_not_lockstep


def square_grads(params: dict[str, Tensor], batch: object) -> tuple[Tensor, dict[str, Tensor]]:
    """L(θ) = θ² whatever the minibatch: gradient 2θ, Hessian 2."""
    theta = params["theta"].requires_grad_(True)
    loss = (theta ** 2).sum()
    (g,) = torch.autograd.grad(loss, [theta])
    return loss.detach(), {"theta": g}


def run(objective: M3FedLoss, theta: float, batches: int) -> tuple[float, list[Tensor]]:
    # no module: the gradient function alone is the loss (the rule never calls the module)
    update = LocalUpdate(None, objective, TrainingSpec(), use_adapter=False,  # type: ignore[arg-type]
                         held=("a",), extras={}, round=1, groups=("shared",))
    start = {"theta": torch.tensor([theta], dtype=torch.float64)}
    done = update.run(start, iter(range(batches)), square_grads)  # type: ignore[arg-type]
    assert done.grad_sum is None
    return float(done.params["theta"]), done.losses


def test_meta_step_by_hand_on_a_square() -> None:
    # θ' = 1 - 0.1·2 = 0.8; v = ∇L(θ') = 1.6; H·v = 2·1.6 = 3.2 (central differences are exact
    # on a quadratic); θ ← 1 - 0.5·(1.6 - 0.1·3.2) = 1 - 0.5·1.28 = 0.36
    obj = M3FedLoss(M3FedLossParams(alpha=0.1, beta=0.5, clip_norm=None))
    theta, losses = run(obj, 1.0, 3)
    assert theta == pytest.approx(0.36, abs=1e-8)
    assert [float(v) for v in losses] == [1.0]      # L(θ; D1) at the step's start
    # six minibatches: two steps; the second from 0.36: 0.36·(1 - 0.5·(1.6 - 0.32)) = 0.36·0.36
    theta, losses = run(obj, 1.0, 6)
    assert theta == pytest.approx(0.36 ** 2, abs=1e-8) and len(losses) == 2


def test_clipping_scales_the_first_order_gradients() -> None:
    # with ‖g‖ ≤ 1: g(θ=1) = 2 -> 1, θ' = 0.9; v = 1.8 -> 1; H·v = 2;
    # θ ← 1 - 0.5·(1 - 0.1·2) = 0.6
    obj = M3FedLoss(M3FedLossParams(alpha=0.1, beta=0.5, clip_norm=1.0))
    theta, _ = run(obj, 1.0, 3)
    assert theta == pytest.approx(0.6, abs=1e-5)


def test_minibatches_group_in_threes_and_a_short_tail_still_steps() -> None:
    assert list(triples(iter(range(5)))) == [(0, 1, 2), (3, 4, 3)]
    assert list(triples(iter(range(1)))) == [(0, 0, 0)]
    assert list(triples(iter(range(6)))) == [(0, 1, 2), (3, 4, 5)]
    assert list(triples(iter([]))) == []


def test_loss_adds_the_consensus_term() -> None:
    g = torch.Generator().manual_seed(0)
    logits, y = torch.randn(4, 3, generator=g), torch.tensor([0, 1, 2, 1])
    out = ModelOutput(logits, None, {}, {})
    trained = {CONSENSUS: torch.tensor([[1.0, 2.0], [0.0, 1.0]])}
    received = {CONSENSUS: torch.eye(2)}
    inp = LossInputs(out, y, torch.ones(4, 1), ("a",), trained, received)
    ce = F.cross_entropy(logits, y).item()
    # MSE(G, G_received) = (0 + 4 + 0 + 0) / 4 = 1, weighted 0.6
    assert M3FedLoss(M3FedLossParams()).loss(inp).item() == pytest.approx(ce + 0.6)
    assert M3FedLoss(M3FedLossParams(lambda_g=0)).loss(inp).item() == pytest.approx(ce)
    bare = LossInputs(out, y, torch.ones(4, 1), ("a",), {}, {})
    assert M3FedLoss(M3FedLossParams()).loss(bare).item() == pytest.approx(ce)


def test_the_rule_keeps_it_off_the_lockstep_path() -> None:
    why = why_not_lockstep(M3FedLoss(M3FedLossParams()))
    assert why is not None and "vectorisable" in why

    class Claims(M3FedLoss):   # even an objective that claims the lock-step contract
        vectorisable = True

    why = why_not_lockstep(Claims(M3FedLossParams()))
    assert why is not None and "local_steps" in why
