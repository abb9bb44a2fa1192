"""`LockstepEncoder` runs an encoder for many devices without `vmap`, with the vmapped call's
bits forward and backward (`raymm.training._kernels.lockstep_encoder`); whole lock-step runs
equal the runs with every encoder under vmap."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn
from torch.func import vmap

from raymm.models.encoders import make_encoder
from raymm.training._kernels.lockstep_conv import blocked_convolutions, routing_convolutions
from raymm.training._kernels.lockstep_encoder import LockstepEncoder, encode_devices
from raymm.training._kernels.module_call import ModuleCall

from helpers import tiny_run_params

#: (kind, per-sample input shape): TIDE's HAR sensors, a wide series, vectors, and a user's
#: own encoder of [C, H, W] images (no `Channels` layer, a bias-free convolution)
KINDS = [("cnn1d", (128, 3)), ("cnn1d", (32, 16)), ("mlp", (12,)), ("mlp", (4, 5)),
         ("cnn2d", (12, 10)), ("cnn2d", (3, 9, 9)), ("user", (2, 9, 7)),
         ("user_no_pool", (2, 9, 7))]


def _encoder(kind: str, shape: tuple[int, ...]) -> nn.Module:
    if kind == "user_no_pool":   # a convolution's output flattened straight into a Linear
        return nn.Sequential(nn.Conv2d(shape[0], 4, 3, stride=2, padding=1), nn.ReLU(),
                             nn.Flatten(), nn.Linear(4 * 5 * 4, 8))
    if kind != "user":
        return make_encoder(kind, shape, 8, 16)
    return nn.Sequential(nn.Conv2d(shape[0], 8, 3, stride=2, padding=1, bias=False), nn.ReLU(),
                         nn.AdaptiveAvgPool2d((1, 1)), nn.Flatten(), nn.Linear(8, 12),
                         nn.ReLU(), nn.Linear(12, 8))


def _stacked(model: nn.Module, g: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
    return {n: torch.randn((g, *p.shape), generator=gen) * 0.3
            for n, p in model.named_parameters()}


def _run(encode, params, x, grad_out):  # noqa: ANN001, ANN202
    leaves = {n: p.detach().requires_grad_(True) for n, p in params.items()}
    xs = x.detach().requires_grad_(True)
    with blocked_convolutions():
        out = encode(leaves, xs)
        grads = torch.autograd.grad(out, [*leaves.values(), xs], grad_out)
    return out.detach(), grads


@pytest.mark.parametrize(("kind", "shape"), KINDS)
@pytest.mark.parametrize("g", [1, 3, 7])
def test_the_lockstep_encoder_gives_the_vmapped_bits_forward_and_backward(
        kind: str, shape: tuple[int, ...], g: int) -> None:
    gen = torch.Generator().manual_seed(g)
    model = nn.ModuleDict({"s": _encoder(kind, shape)})
    call = ModuleCall(model)
    assert LockstepEncoder.of(call, model["s"]) is not None
    params = _stacked(model, g, gen)
    x = torch.randn((g, 5, *shape), generator=gen)
    grad_out = torch.randn((g, 5, 8), generator=gen)
    out, grads = _run(lambda p, xs: encode_devices(call, model["s"], p, xs), params, x, grad_out)
    ref, ref_grads = _run(lambda p, xs: vmap(lambda q, xb: call.run(q, model["s"], xb))(p, xs),
                          params, x, grad_out)
    assert torch.equal(out, ref)
    for got, want in zip(grads, ref_grads, strict=True):
        assert torch.equal(got, want)


def test_a_device_s_embedding_does_not_depend_on_the_devices_beside_it() -> None:
    gen = torch.Generator().manual_seed(0)
    model = nn.ModuleDict({"s": make_encoder("cnn1d", (128, 3), 8, 16)})
    call = ModuleCall(model)
    params = _stacked(model, 6, gen)
    x = torch.randn((6, 4, 128, 3), generator=gen)
    with blocked_convolutions():
        together = encode_devices(call, model["s"], params, x)
        alone = encode_devices(call, model["s"], {n: t[4:5] for n, t in params.items()}, x[4:5])
    assert torch.equal(together[4], alone[0])


def test_layers_it_does_not_know_and_convolutions_outside_a_program_take_vmap() -> None:
    gen = torch.Generator().manual_seed(1)
    # a layer it does not know, a 1-D pool to more than one step and a nested module are not
    # planned
    unknown = nn.ModuleDict({"s": nn.Sequential(nn.Conv1d(2, 4, 3), nn.MaxPool1d(2))})
    pool_1d = nn.ModuleDict({"s": nn.Sequential(nn.Conv1d(2, 4, 3), nn.AdaptiveAvgPool1d(2))})
    nested = nn.ModuleDict({"s": nn.Sequential(nn.Flatten(), nn.Sequential(nn.Linear(4, 8)))})
    for model in (unknown, pool_1d, nested):
        assert LockstepEncoder.of(ModuleCall(model), model["s"]) is None
    # outside `blocked_convolutions`, vmap's own convolution runs: so does encode_devices
    model = nn.ModuleDict({"s": make_encoder("cnn1d", (16, 3), 8, 16)})
    call = ModuleCall(model)
    params = _stacked(model, 3, gen)
    x = torch.randn((3, 4, 16, 3), generator=gen)
    assert not routing_convolutions()
    got = encode_devices(call, model["s"], params, x)
    want = vmap(lambda q, xb: call.run(q, model["s"], xb))(params, x)
    assert torch.equal(got, want)


def test_a_plan_keeps_no_model_alive() -> None:
    import gc
    import weakref

    model = nn.ModuleDict({"s": make_encoder("cnn1d", (16, 3), 8, 16)})
    call = ModuleCall(model)
    assert LockstepEncoder.of(call, model["s"]) is LockstepEncoder.of(call, model["s"])
    gone = weakref.ref(model)
    del model, call
    gc.collect()
    assert gone() is None


@pytest.fixture(autouse=True)
def _out_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # run(out=None) writes under ./runs


def test_encoders_run_as_their_own_layer_calls_give_the_vmapped_run_bit_for_bit(monkeypatch):
    """`LockstepEncoder` runs known encoders without vmap, in a closed-form step (TIDE), in a
    step through the model's loss (cross-entropy, 1-D and 2-D CNNs) and for the devices that
    hold a sensor (`SensorEncoders`): whole lock-step runs equal the runs with every encoder
    under vmap."""
    planned = []
    of = LockstepEncoder.of.__func__

    def watched(cls, call, encoder):  # noqa: ANN001, ANN202
        plan = of(cls, call, encoder)
        planned.append(plan is not None)
        return plan
    sensors = {"a": {"dim": 3, "length": 32, "informativeness": 1.0},
               "b": {"dim": 2, "length": 32, "informativeness": 0.5}}
    # the tiny scenario's tiers mix sensor sets: `SensorEncoders` runs for both methods; the
    # 2-D CNN's adaptive pool too
    for extra in ({}, {"method": "tide", "aggregation": {"name": "tide", "warmup": 1}},
                  {"model.encoder": "cnn2d"}):
        base = {"dataset.sensors": sensors, "model.encoder": "cnn1d", "selection.k": 8,
                "rounds": 2, "execution.training.path": "lockstep", "training.optimizer": "adam",
                "training.lr": 0.01, **extra}
        planned.clear()
        monkeypatch.setattr(LockstepEncoder, "of", classmethod(watched))
        stacked, _ = tiny_run_params(base)
        assert planned and all(planned)
        monkeypatch.setattr(LockstepEncoder, "of", classmethod(lambda cls, call, encoder: None))
        under_vmap, _ = tiny_run_params(base)
        for g in stacked:
            assert np.array_equal(under_vmap[g], stacked[g]), (extra, g)
