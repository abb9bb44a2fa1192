"""Convolutions of a lock-step program whose result does not depend on the program's size
(raymm.training._kernels.lockstep_conv): in runs, hosts of 1 and of 5 devices give the same
bits and the grouped call without the custom operator is the operator's; by hand, a blocked
convolution gives a device the same bits whatever the device count (forward, backward, wide
weight gradients in blocks, global average pools, interleaved minibatches as views) and nested
vmap takes the operator."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from raymm.training._kernels.lockstep_encoder import LockstepEncoder

from helpers import tiny_run_params


@pytest.fixture(autouse=True)
def _out_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # run(out=None) writes under ./runs


def test_convolutional_encoders_in_lock_step_do_not_depend_on_the_packing():
    """Under vmap a convolution with per-device weights is one grouped convolution; oneDNN
    picks its algorithm by the group and channel counts, so on a CPU a device's bits depended
    on how many devices shared its program (1-2 against 3 or more with 3 channels per device).
    Lock-step programs convolve in blocks of a fixed number of devices
    (`raymm.training._kernels.lockstep_conv`): one host, hosts of 1 and of 5 devices give the
    same bits."""
    sensors = {"a": {"dim": 3, "length": 32, "informativeness": 1.0},
               "b": {"dim": 2, "length": 32, "informativeness": 0.5}}
    base = {"dataset.sensors": sensors, "model.encoder": "cnn1d", "selection.k": 8,
            "rounds": 2, "execution.training.path": "lockstep"}
    ref, _ = tiny_run_params(base)
    for per in (1, 5):
        got, _ = tiny_run_params({**base, "execution.devices_per_actor": per})
        for g in ref:
            assert np.array_equal(got[g], ref[g]), (per, g)


def test_per_device_convolutions_without_the_custom_operator_give_the_same_bits(monkeypatch):
    """`lockstep_conv._direct` makes the grouped call of `lockstep_conv`'s vmap rule without the
    custom operator's Python layers: a lock-step run is bit for bit the run through the
    operator, forward and backward."""
    import raymm.training._kernels.lockstep_conv as lc

    sensors = {"a": {"dim": 3, "length": 32, "informativeness": 1.0},
               "b": {"dim": 2, "length": 32, "informativeness": 0.5}}
    base = {"dataset.sensors": sensors, "model.encoder": "cnn1d", "selection.k": 8,
            "rounds": 2, "execution.training.path": "lockstep", "training.optimizer": "adam",
            "training.lr": 0.01}
    calls = []
    direct = lc._direct
    monkeypatch.setattr(lc, "_direct", lambda *a: calls.append(1) or direct(*a))
    # the encoders under vmap, where `_direct` serves (not as `LockstepEncoder`'s own calls)
    monkeypatch.setattr(LockstepEncoder, "of", classmethod(lambda cls, call, encoder: None))
    ref, _ = tiny_run_params(base)
    assert calls
    monkeypatch.setattr(lc, "_direct", lambda *a: None)
    via_operator, _ = tiny_run_params(base)
    for g in ref:
        assert np.array_equal(via_operator[g], ref[g]), g


def test_per_device_convolutions_under_nested_vmap_take_the_operator():
    """Two vmap levels (devices, then something inside a device) are not the simple case
    `_direct` unwraps: the custom operator's rule computes them, and each result is the plain
    convolution's."""
    from torch.func import vmap

    from raymm.training._kernels.lockstep_conv import blocked_convolutions

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 2, 4, 5, 16, generator=gen)        # devices, inner, batch, C, L
    w = torch.randn(3, 6, 5, 3, generator=gen)            # devices, O, C, K
    with blocked_convolutions():
        out = vmap(lambda xd, wd: vmap(lambda xi: F.conv1d(xi, wd, padding=1))(xd))(x, w)
    for d in range(3):
        for i in range(2):
            torch.testing.assert_close(out[d, i], F.conv1d(x[d, i], w[d], padding=1))


def _device_zero(devices: int, channels: int, two_d: bool) -> dict[str, torch.Tensor]:
    """Device 0's tensors, output and gradients from one blocked convolution of `devices`
    devices: device 0's inputs fixed, the others' drawn afresh."""
    from torch.func import vmap

    from raymm.training._kernels.lockstep_conv import blocked_convolutions

    space, kernel = ((9, 11), (3, 3)) if two_d else ((24,), (5,))
    fixed, other = torch.Generator().manual_seed(0), torch.Generator().manual_seed(devices)

    def draw(*shape: int) -> torch.Tensor:
        return torch.cat([torch.randn(1, *shape, generator=fixed),
                          torch.randn(devices - 1, *shape, generator=other)]).requires_grad_()

    x, w, b = draw(4, channels, *space), draw(6, channels, *kernel), draw(6)
    with blocked_convolutions():
        conv = F.conv2d if two_d else F.conv1d  # as routed while the block lasts
        out = vmap(lambda xd, wd, bd: conv(xd, wd, bd, stride=2, padding=1))(x, w, b)
    out.backward(torch.linspace(-1, 1, out[0].numel()).reshape(out[0].shape).expand_as(out))
    return {"x": x[0].detach(), "w": w[0].detach(), "b": b[0].detach(),
            "output": out[0].detach(), "weight grad": w.grad[0], "bias grad": b.grad[0],
            "input grad": x.grad[0]}


@pytest.mark.parametrize("two_d", [False, True])
@pytest.mark.parametrize("channels", [1, 3, 16])
def test_a_blocked_convolution_gives_a_device_the_same_bits_whatever_the_device_count(
        channels, two_d):
    """The grouped channels-last call of `raymm.training._kernels.lockstep_conv` computes a device's
    output and gradients alike whether 1, 2, 3, 5, 9 or 17 devices share it (fewer than the
    minimum are padded with zero devices), for 1-D and 2-D convolutions; and the output is the
    plain convolution's."""
    ref = _device_zero(1, channels, two_d)
    for devices in (2, 3, 5, 9, 17):
        got = _device_zero(devices, channels, two_d)
        for name in ("output", "weight grad", "bias grad", "input grad"):
            assert torch.equal(got[name], ref[name]), (devices, name)
    plain = (F.conv2d if two_d else F.conv1d)(ref["x"], ref["w"], ref["b"], stride=2, padding=1)
    torch.testing.assert_close(ref["output"], plain)


@pytest.mark.parametrize("input_grad", [False, True])
def test_a_wide_convolutions_weight_gradient_in_blocks_of_devices_has_the_same_bits(
        monkeypatch, input_grad):
    """A grouped call of many devices whose channel count is off oneDNN's 8-channel blocking
    (FedMChain's 129-bin spectrograms) computes its weight and bias gradients in blocks of a
    few devices (`lockstep_conv._WeightGradInBlocks`): output, input, weight and bias
    gradients are the bits of the single call, for a block that ends short of the block size
    too."""
    from torch.func import vmap

    import raymm.training._kernels.lockstep_conv as lc

    def grads(wide: int) -> tuple[torch.Tensor | None, ...]:
        monkeypatch.setattr(lc, "WIDE_CALL_CHANNELS", wide)
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(7, 4, 33, 21, generator=gen).requires_grad_(input_grad)
        w = (torch.randn(7, 6, 33, 5, generator=gen) / 8).requires_grad_()
        b = torch.randn(7, 6, generator=gen).requires_grad_()
        with lc.blocked_convolutions():
            out = vmap(lambda xd, wd, bd: F.conv1d(xd, wd, bd, stride=2, padding=2))(x, w, b)
        out.relu().backward(torch.linspace(-1, 1, out.numel()).reshape(out.shape))
        return out.detach(), x.grad, w.grad, b.grad

    blocks = []
    device_blocks = lc._device_blocks
    monkeypatch.setattr(lc, "_device_blocks", lambda *a: blocks.append(device_blocks(*a))
                        or blocks[-1])
    monkeypatch.setattr(lc, "BLOCK_CHANNELS", 3 * 33)
    one_call = grads(10**9)
    assert not blocks
    in_blocks = grads(33)
    assert blocks == [[(0, 3), (3, 7)]]     # a last block of one device joins the one before
    for name, a, b in zip(("output", "input grad", "weight grad", "bias grad"), one_call,
                          in_blocks):
        assert (a is None and b is None) if name == "input grad" and not input_grad \
            else torch.equal(a, b), name


def test_a_global_average_pool_of_per_device_tensors_is_their_mean_without_a_fallback():
    """Within a lock-step program a global average pool of per-device tensors (the channels-last
    results of blocked convolutions) is a plain mean: the plain pool's numbers, and no vmap
    fallback that would loop over devices (torch warns of one when it happens)."""
    import warnings

    from torch.func import vmap

    from raymm.training._kernels.lockstep_conv import blocked_convolutions

    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(5, 4, 3, 20, generator=gen), torch.randn(5, 8, 3, 5, generator=gen)
    img, k = torch.randn(5, 4, 3, 9, 9, generator=gen), torch.randn(5, 8, 3, 3, 3, generator=gen)
    with warnings.catch_warnings(record=True) as caught, blocked_convolutions():
        warnings.simplefilter("always")
        one = vmap(lambda xd, wd: F.adaptive_avg_pool1d(F.conv1d(xd, wd, padding=2), 1))(x, w)
        two = vmap(lambda xd, wd: F.adaptive_avg_pool2d(F.conv2d(xd, wd, padding=1), 1))(img, k)
        keep = vmap(lambda xd, wd: F.adaptive_avg_pool2d(F.conv2d(xd, wd, padding=1), 2))(img, k)
    assert not [c for c in caught if "performance drop" in str(c.message)]
    for d in range(5):
        conv1, conv2 = F.conv1d(x[d], w[d], padding=2), F.conv2d(img[d], k[d], padding=1)
        torch.testing.assert_close(one[d], F.adaptive_avg_pool1d(conv1, 1))
        torch.testing.assert_close(two[d], F.adaptive_avg_pool2d(conv2, 1))
        torch.testing.assert_close(keep[d], F.adaptive_avg_pool2d(conv2, 2))


def test_an_interleaved_minibatch_reaches_a_convolution_as_a_view_with_the_same_bits():
    """A `[T, C]` series with many channels is gathered device-interleaved for a lock-step
    program (`lockstep_conv.interleaved_rows`): the same values as a plain gather, still so
    after picking devices (`select_devices`), and the grouped convolution reads it without
    copying the minibatch, to the same bits as from a plain gather."""
    from torch.func import vmap
    from torch.utils._python_dispatch import TorchDispatchMode

    from raymm.models.encoders import make_encoder
    from raymm.training._kernels.lockstep_conv import (
        blocked_convolutions,
        interleaved_rows,
        select_devices,
        takes_interleaved,
    )

    gen = torch.Generator().manual_seed(0)
    data = torch.randn(40, 21, 17, generator=gen)              # samples, T, C
    rows = torch.randint(0, 40, (5, 6), generator=gen)         # devices, batch
    plain = data.index_select(0, rows.reshape(-1)).view(5, 6, 21, 17)
    inter = interleaved_rows(data, rows)
    assert torch.equal(inter, plain) and inter.permute(1, 2, 0, 3).is_contiguous()
    pick = torch.tensor([4, 1, 2])
    picked = select_devices(inter, pick)
    assert torch.equal(picked, plain.index_select(0, pick))
    assert picked.permute(1, 2, 0, 3).is_contiguous()

    encoder = make_encoder("cnn1d", (21, 17), 8, 16)
    assert takes_interleaved(encoder, (21, 17)) and not takes_interleaved(encoder, (21, 3))
    weights = {n: torch.randn(5, *p.shape, generator=gen) for n, p in encoder.named_parameters()}

    class Copies(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.floats = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
            out = func(*args, **(kwargs or {}))
            if func in (torch.ops.aten.clone.default, torch.ops.aten.copy_.default) and \
                    out.numel() == plain.numel():
                self.floats += out.numel()   # a copy of the minibatch
            return out

    def encode(x: torch.Tensor) -> tuple[torch.Tensor, int]:
        with blocked_convolutions(), Copies() as copies:
            out = vmap(lambda p, xb: torch.func.functional_call(encoder, p, (xb,)))(weights, x)
        return out, copies.floats

    got, copied = encode(inter)
    ref, copied_plain = encode(plain)
    assert torch.equal(got, ref)
    assert copied_plain == plain.numel() and copied == 0   # a plain gather is moved, not this
