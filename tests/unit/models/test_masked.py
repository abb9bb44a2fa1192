"""Evaluation under several sensor masks with each encoder run at most twice
(`raymm.models.masked`): the same numbers as a whole forward pass per mask; and, against the
same whole passes, the server's subset evaluator (raymm.server.evaluation) batch by batch and
a device's own evaluation (raymm.device.evaluation)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch
from torch import nn

from raymm.config.schema import ModelSpec
from raymm.data.base import Split
from raymm.device.evaluation import evaluate_device
from raymm.models import GroupLayout, MultimodalNet, RaymmNet
from raymm.models.factory import WholeNet
from raymm.models.masked import MaskedForward, evaluating
from raymm.server import evaluation
from raymm.server.robustness import head_accuracies

SHAPES = {"acc": (32, 3), "gyro": (32, 3), "mag": (6,)}
MASKS = [(True, True, True), (True, False, False), (False, True, False), (False, False, True),
         (True, True, False), (True, False, True)]


def _net(**spec: object) -> MultimodalNet:
    torch.manual_seed(0)
    net = MultimodalNet(tuple(SHAPES), SHAPES, 4,
                        ModelSpec(embed_dim=8, hidden=8, fusion_dim=8, **spec))  # type: ignore[arg-type]
    if net.adapter is not None:   # an adapter that is no longer the identity
        with torch.no_grad():
            net.adapter[2].weight.normal_(0, 0.5)
    return net


def _inputs(n: int, seed: int = 1) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {m: torch.randn((n, *s), generator=g) for m, s in SHAPES.items()}


def _whole_pass(model: RaymmNet, xs: dict[str, torch.Tensor], mask: tuple[bool, ...],
                use_adapter: bool = False) -> torch.Tensor:
    """The definition: zero the masked-out sensors, mark them absent, run the whole model."""
    xb = {m: x if on else torch.zeros_like(x) for (m, x), on in zip(xs.items(), mask)}
    present = torch.tensor([mask], dtype=torch.float32).expand(len(next(iter(xs.values()))), -1)
    with torch.no_grad(), evaluating(model):
        return model(xb, present, use_adapter=use_adapter).logits


def _count_encoder_runs(model: MultimodalNet) -> Counter[str]:
    runs: Counter[str] = Counter()
    for m, enc in model.encoders.items():
        enc.register_forward_hook(lambda *_, m=m: runs.update([m]))
    return runs


@pytest.mark.parametrize("spec", [{}, {"aux_heads": True, "adapter": True},
                                  {"fusion": "sum_logits"}])
def test_every_mask_gives_the_whole_pass_bits_with_two_runs_per_encoder(spec: dict) -> None:
    model, xs = _net(**spec), _inputs(37)
    use_adapter = model.adapter is not None
    expected = [_whole_pass(model, xs, mask, use_adapter) for mask in MASKS]
    runs = _count_encoder_runs(model)
    passes = MaskedForward(model, xs)
    with torch.no_grad(), evaluating(model):
        got = [passes(mask, use_adapter).logits for mask in MASKS]
    for mask, e, g in zip(MASKS, expected, got):
        assert torch.equal(e, g), mask
    assert runs == {m: 2 for m in SHAPES}   # real inputs once, zeros once


def test_a_model_without_embeddings_runs_whole_passes() -> None:
    class Flat(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(32 * 3 * 2 + 6, 4)

        def forward(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
            return self.lin(torch.cat([x.flatten(1) for x in inputs.values()], 1))

    torch.manual_seed(0)
    model, xs = WholeNet(Flat(), tuple(SHAPES)), _inputs(5)
    passes = MaskedForward(model, xs)
    with torch.no_grad(), evaluating(model):
        for mask in MASKS:
            assert torch.equal(passes(mask).logits, _whole_pass(model, xs, mask))


def test_evaluating_restores_training_mode_and_nests() -> None:
    model = _net()
    with evaluating(model):
        assert not model.training and not model.fusion.training
        with evaluating(model):
            assert not model.training
        assert not model.training   # the inner block leaves the outer one's mode alone
    assert model.training and model.fusion.training
    model.eval()
    with evaluating(model):
        pass
    assert not model.training   # a model in eval mode stays so


@pytest.mark.parametrize("keep", [True, False])
def test_subset_evaluator_matches_whole_passes_batch_by_batch(
        keep: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    if not keep:   # embeddings over the budget: each subset runs the encoders again
        monkeypatch.setattr(evaluation, "KEEP_BYTES", 0)
    model = _net(aux_heads=True)
    n, batch = 50, 16   # four batches, the last one short
    xs = _inputs(n, seed=3)
    y = np.random.default_rng(0).integers(0, 4, n)
    split = Split({m: x.numpy() for m, x in xs.items()}, y)
    runs = _count_encoder_runs(model)
    ev = evaluation.SubsetEvaluator(model, split, batch)
    subsets = [tuple(SHAPES), ("acc",), ("gyro", "mag"), ("acc", "mag")]
    results = {s: ev(s) for s in subsets}
    heads = head_accuracies(ev)
    # per batch: real inputs once, zeros once; without keeping, once per subset and the heads
    assert runs == {m: 4 * (2 if keep else len(subsets) + 1) for m in SHAPES}
    assert model.training
    for s, res in results.items():
        mask = tuple(m in s for m in SHAPES)
        logits = torch.cat([_whole_pass(model, {m: x[a:a + batch] for m, x in xs.items()}, mask)
                            for a in range(0, n, batch)])
        assert np.array_equal(res.predictions, logits.argmax(1).numpy()), s
        assert res.accuracy == float((logits.argmax(1).numpy() == y).mean())
    with torch.no_grad(), evaluating(model):
        emb = {m: model.encoders[m](x) for m, x in xs.items()}
    for m in SHAPES:
        own = model.heads[m](emb[m]).argmax(1).numpy()
        assert heads[m] == pytest.approx(float((own == y).mean()))


def test_evaluate_device_counts_match_whole_passes() -> None:
    model = _net(adapter=True)
    layout = GroupLayout(model)
    vectors = layout.flatten(model, list(layout.slots))
    xs, y = _inputs(23, seed=4), torch.from_numpy(np.random.default_rng(1).integers(0, 4, 23))
    held = np.array([True, False, True])
    correct, loss, only, _ = evaluate_device(model, layout, vectors, xs, y, held, True)
    full = _whole_pass(model, xs, tuple(held), True)
    assert correct == int((full.argmax(1) == y).sum())
    assert loss == float(torch.nn.functional.cross_entropy(full, y, reduction="sum"))
    for j in range(len(SHAPES)):
        alone = tuple(k == j for k in range(len(SHAPES)))
        assert only[j] == int((_whole_pass(model, xs, alone, True).argmax(1) == y).sum())
    assert model.training
