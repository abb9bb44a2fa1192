"""Convolutions of a lock-step program whose result does not depend on the program's size.

Under `vmap` a convolution whose weights are stacked per device becomes one grouped
convolution with a group per device, and oneDNN picks its algorithm by the group count and
the total channel count: measured on a CPU, a device's output and gradients take other last
bits with 1 or 2 devices in a program than with 3 or more (3 input channels per device), with
1 to 4 than with 8 (1 channel), and with 1 against more for any channel count. A device's
numbers would then depend on how many devices share its program, hence on the packing.
PyTorch's own grouped convolution (oneDNN off) keeps them apart but made a TIDE round on HAR
twice as slow, and one oneDNN call per device half as slow again.

Here, while a program runs (`blocked_convolutions`), `F.conv1d`/`F.conv2d` on per-device
weights go through `raymm::lockstep_conv`, whose vmap rule makes every call hold at least 2
groups and 8 input channels in all (`MIN_GROUPS`, `MIN_CHANNELS`): a program of fewer devices is
padded with zero devices. Past those, oneDNN computes every group alike whatever the group
count and the group's position, so a device's numbers are those of any other packing.

The call is channels last (memory `[B, *S, devices, C]`; a 1-D convolution is a 2-D one of
height 1): oneDNN's grouped kernels are faster for that layout (docs/performance.md,
"Convolutions whose bits do not depend on the program's size"), and a layer's output is the
next layer's input without a copy. Measured for this layout: 1 to 129 input and 4 to 64
output channels per device, 2 to 100 devices, 1-D (kernel 5, stride 2) and 2-D (kernel 3, stride
2) convolutions: outputs, weight and input gradients the same bits. A global average pool of
per-device tensors is a plain mean meanwhile (torch's own restrides a channels-last result in
place, which vmap does device by device).
A program gathers a many-channel `[T, C]` minibatch device-interleaved for this call
(`interleaved_rows`), so the call reads it without a copy. A wide call of a channel count off
oneDNN's 8-channel blocking takes its weight gradient in blocks of devices, the same bits
faster (`_WeightGradInBlocks`).
`tests/unit/training/_kernels/test_lockstep_conv.py` checks group counts directly and packings
of 1, 5 and all devices with convolutional encoders. A call without per-device tensors (outside
vmap) is the plain one.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch._C import _functorch as _ft

from raymm.models.encoders import Channels
from raymm.training.local_update import memory_order

#: the fewest input channels a call holds (all groups together): below 8, oneDNN takes a
#: small-channel path (measured: 1 channel x 4 devices or 3 x 2 differ from 8 or 9 and more)
MIN_CHANNELS = 8
#: the fewest groups in a call: one group is an ungrouped convolution, another algorithm
MIN_GROUPS = 2

_PLAIN: dict[int, Callable[..., Tensor]] = {1: F.conv1d, 2: F.conv2d}


@torch.library.custom_op("raymm::lockstep_conv", mutates_args=())
def lockstep_conv(x: Tensor, weight: Tensor, bias: Tensor | None, stride: list[int],
                padding: list[int], dilation: list[int], groups: int) -> Tensor:
    """One device's convolution (1-D or 2-D by the weight's rank); the vmap rule is the point."""
    return _PLAIN[weight.dim() - 2](x, weight, bias, stride, padding, dilation, groups)


@lockstep_conv.register_fake
def _(x: Tensor, weight: Tensor, bias: Tensor | None, stride: list[int], padding: list[int],
      dilation: list[int], groups: int) -> Tensor:
    return _PLAIN[weight.dim() - 2](x, weight, bias, stride, padding, dilation, groups)


def _device_axis(t: Tensor | None, dim: int | None, g: int) -> Tensor | None:
    if t is None:
        return None
    return t.movedim(dim, 0) if dim is not None else t.expand(g, *t.shape)


def _blocked(info: Any, in_dims: tuple[Any, ...], x: Tensor, weight: Tensor,
             bias: Tensor | None, stride: list[int], padding: list[int], dilation: list[int],
             groups: int) -> tuple[Tensor, int]:
    """The vmap rule (see `grouped_conv`)."""
    return grouped_conv(info.batch_size, in_dims, x, weight, bias, stride, padding, dilation,
                        groups)


def grouped_conv(g: int, in_dims: tuple[Any, ...], x: Tensor, weight: Tensor,
                 bias: Tensor | None, stride: list[int], padding: list[int],
                 dilation: list[int], groups: int) -> tuple[Tensor, int]:
    """g devices' x [G, B, C, *S], weight [G, O, C/groups, *K] (each with its device axis at
    `in_dims`, None: the same for all) -> [B, G, O, *S'] (device axis 1), as one grouped
    convolution of at least `MIN_GROUPS` devices and `MIN_CHANNELS` input channels."""
    xs = _device_axis(x, in_dims[0], g)
    ws = _device_axis(weight, in_dims[1], g)
    bs = _device_axis(bias, in_dims[2], g)
    assert xs is not None and ws is not None
    # zero devices fill the call up to the smallest it may be (padding costs compute: a step
    # with one device pays for two, or for 8 with one input channel)
    need = max(MIN_GROUPS, -(-MIN_CHANNELS // xs.shape[2]))
    if g < need:
        fill = need - g
        xs = torch.cat([xs, xs.new_zeros((fill, *xs.shape[1:]))])
        ws = torch.cat([ws, ws.new_zeros((fill, *ws.shape[1:]))])
        bs = torch.cat([bs, bs.new_zeros((fill, *bs.shape[1:]))]) if bs is not None else None
    n, batch, channels = xs.shape[0], xs.shape[1], xs.shape[2]
    out_ch = ws.shape[1]
    one_d = ws.dim() == 4
    if one_d:  # a 1-D convolution runs as a 2-D one of height 1 (oneDNN's channels-last kernels)
        xs, ws = xs.unsqueeze(3), ws.unsqueeze(3)
        stride, padding, dilation = [1, *stride], [0, *padding], [1, *dilation]
    height, width = xs.shape[3], xs.shape[4]
    # devices side by side along the channels, channels last: memory [B, H, W, n*C] (a view
    # when x is the channels-last output of the call before)
    flat_x = (xs.permute(1, 3, 4, 0, 2).reshape(batch, height, width, n * channels)
              .permute(0, 3, 1, 2))
    flat_w = (ws.reshape(n * out_ch, *ws.shape[2:]).permute(0, 2, 3, 1).contiguous()
              .permute(0, 3, 1, 2))  # channels last too (`memory_format=` is refused under vmap)
    flat_b = bs.reshape(-1) if bs is not None else None
    # the plain kernel, not `F.conv2d`, which `blocked_convolutions` routes back here
    plain = not any(_ft.is_functorch_wrapped_tensor(t) for t in (flat_x, flat_w, flat_b)
                    if t is not None)   # not under a further transform (nested vmap)
    # oneDNN's slow case, measured on CPUs only (a GPU's kernels are cuDNN's)
    if plain and flat_x.device.type == "cpu" and channels % 8 and \
            n * channels > WIDE_CALL_CHANNELS:
        out = _WeightGradInBlocks.apply(flat_x, flat_w, flat_b, stride, padding, dilation,
                                        groups, n)
    else:
        out = _PLAIN[2](flat_x, flat_w, flat_b, stride, padding, dilation, n * groups)
    # [B, n, O, H', W'] as a view: the device axis stays at dim 1, channels innermost
    out = out.reshape(batch, n, out_ch, *out.shape[2:])[:, :g]
    return (out.squeeze(3) if one_d else out), 1


torch.library.register_vmap("raymm::lockstep_conv", _blocked)

#: how many `blocked_convolutions` blocks are open (`routing_convolutions`)
_ROUTING = 0

#: a grouped call of more input channels than this (all devices together), a device's count
#: not a multiple of 8, computes its weight gradient in blocks (`_WeightGradInBlocks`)
WIDE_CALL_CHANNELS = 2048
#: about how many input channels each of those blocks holds
BLOCK_CHANNELS = 512


def _device_blocks(devices: int, channels: int) -> list[tuple[int, int]]:
    """[start, end) device ranges of about `BLOCK_CHANNELS` input channels each, none of fewer
    than `MIN_GROUPS` devices (a short last block joins the one before)."""
    per = max(MIN_GROUPS, BLOCK_CHANNELS // channels)
    starts = list(range(0, devices, per))
    if len(starts) > 1 and devices - starts[-1] < MIN_GROUPS:
        starts.pop()
    return list(zip(starts, [*starts[1:], devices]))


class _WeightGradInBlocks(torch.autograd.Function):
    """The grouped channels-last convolution of `grouped_conv`, whose weight (and bias) gradient is
    computed in blocks of devices (`_device_blocks`). With a device's channel count off oneDNN's
    8-channel blocking, its backward-weights kernel for one call of many groups is slower than
    the same work in blocks of a few devices (docs/performance.md, "Convolutions whose bits do
    not depend on the program's size"; blocking the forward was not). Each group's numbers are
    the same bits either way (the guarantee of the module docstring), and the input gradient is
    the one call autograd would make."""

    @staticmethod
    def forward(x: Tensor, weight: Tensor, bias: Tensor | None, stride: list[int],
                padding: list[int], dilation: list[int], groups: int, devices: int) -> Tensor:
        return _PLAIN[2](x, weight, bias, stride, padding, dilation, devices * groups)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
        x, weight, _, *ctx.conf = inputs
        ctx.save_for_backward(x, weight)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        x, weight = ctx.saved_tensors
        stride, padding, dilation, groups, devices = ctx.conf
        backward = torch.ops.aten.convolution_backward
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        grad_x = None
        if need_x:
            grad_x = backward(grad, x, weight, None, stride, padding, dilation, False, [0, 0],
                              devices * groups, [True, False, False])[0]
        grad_w: list[Tensor] = []
        grad_b: list[Tensor] = []
        if need_w or need_b:
            cin, cout = x.shape[1] // devices, weight.shape[0] // devices
            for s, e in _device_blocks(devices, cin):
                block = backward(grad[:, s * cout:e * cout], x[:, s * cin:e * cin],
                                 weight[s * cout:e * cout], [(e - s) * cout], stride, padding,
                                 dilation, False, [0, 0], (e - s) * groups,
                                 [False, need_w, need_b])
                grad_w.append(block[1])
                grad_b.append(block[2])
        return (grad_x, torch.cat(grad_w) if need_w else None,
                torch.cat(grad_b) if need_b else None, None, None, None, None, None)

    @staticmethod
    def vmap(info: Any, in_dims: tuple[Any, ...], *args: Any) -> tuple[Tensor, None]:
        """Applied to plain (unwrapped) tensors inside a vmap: no device axis to map."""
        assert all(d is None for d in in_dims)
        return _WeightGradInBlocks.apply(*args), None


def _direct(x: Tensor, weight: Tensor, bias: Tensor | None, stride: list[int],
            padding: list[int], dilation: list[int], groups: int) -> Tensor | None:
    """`lockstep_conv` under one plain `vmap` level, without the custom operator's Python
    layers (a third of a TIDE round's encoder time): the per-device tensors are unwrapped,
    convolved by `grouped_conv` -- the very call the vmap rule makes -- and the result wrapped
    again; autograd records the grouped call as it would inside the rule. None when the
    tensors are not that simple (another transform, or several vmap levels): the caller then
    takes `lockstep_conv`."""
    tensors = (x, weight, bias)
    levels = {_ft.maybe_get_level(t) for t in tensors if t is not None and _ft.is_batchedtensor(t)}
    if len(levels) != 1:
        return None
    level = levels.pop()
    phys: list[Tensor | None] = []
    dims: list[int | None] = []
    for t in tensors:
        if t is not None and _ft.is_batchedtensor(t):
            t, d = _ft._unwrap_batched(t, level)
        else:
            d = None
        if t is not None and _ft.is_functorch_wrapped_tensor(t):
            return None
        phys.append(t)
        dims.append(d)
    g = next(p.shape[d] for p, d in zip(phys, dims) if d is not None)  # type: ignore[union-attr]
    px, pw = phys[0], phys[1]
    assert px is not None and pw is not None
    out, out_dim = grouped_conv(g, tuple(dims), px, pw, phys[2], stride, padding, dilation, groups)
    return _ft._add_batch_dim(out, out_dim, level)


def _routed(plain: Callable[..., Tensor]) -> Callable[..., Tensor]:
    """`plain` (F.conv1d or F.conv2d), sending calls on per-device tensors through
    `lockstep_conv`."""
    def conv(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride: Any = 1,
             padding: Any = 0, dilation: Any = 1, groups: int = 1) -> Tensor:
        batched = torch._C._functorch.is_batchedtensor
        if isinstance(padding, str) or not (batched(weight) or batched(input)):
            return plain(input, weight, bias, stride, padding, dilation, groups)
        dims = weight.dim() - 2
        args = (_pair(stride, dims), _pair(padding, dims), _pair(dilation, dims), groups)
        out = _direct(input, weight, bias, *args)
        return out if out is not None else lockstep_conv(input, weight, bias, *args)
    return conv


def _pair(v: Any, dims: int) -> list[int]:
    return [int(v)] * dims if isinstance(v, int) else [int(e) for e in v]


def _pooled(plain: Callable[..., Tensor], dims: int) -> Callable[..., Tensor]:
    """`plain` (F.adaptive_avg_pool1d or 2d), taking a plain mean for a global pool of
    per-device tensors: on the channels-last results of `grouped_conv` torch's own global pool
    restrides its result in place, which vmap can only do device by device."""
    def pool(input: Tensor, output_size: Any) -> Tensor:
        sizes = [output_size] * dims if isinstance(output_size, int) else list(output_size)
        if sizes == [1] * dims and _ft.is_batchedtensor(input):
            return global_mean(input, dims)
        return plain(input, output_size)
    return pool


def global_mean(t: Tensor, dims: int) -> Tensor:
    """The mean over `t`'s last `dims` axes, kept as size 1: a sum and a division, as torch's
    mean computes it; its gradient reaches the layer before as a broadcast view, not a tensor
    in another memory order. `lockstep_encoder` pools with it too, for the same bits."""
    return t.sum(tuple(range(-dims, 0)), keepdim=True) / math.prod(t.shape[-dims:])


#: the fewest floats per time step for which a 1-D convolution's minibatch is gathered
#: interleaved (`interleaved_rows`): shorter rows gather faster as whole samples, then moved
INTERLEAVE_MIN_CHANNELS = 16


def takes_interleaved(encoder: nn.Module, shape: tuple[int, ...]) -> bool:
    """Whether a lock-step program should hand `encoder` its minibatch device-interleaved
    (`interleaved_rows`): a `[T, C]` series of at least `INTERLEAVE_MIN_CHANNELS` channels
    that the encoder turns to `[C, T]` for a 1-D convolution first. The grouped call reads
    its input as `[B, T, devices x C]` memory (`grouped_conv`); gathered so, it is a view there
    rather than a copy of the whole minibatch."""
    layers = list(encoder.children()) if isinstance(encoder, nn.Sequential) else []
    return (len(shape) == 2 and shape[1] >= INTERLEAVE_MIN_CHANNELS and len(layers) >= 2
            and isinstance(layers[0], Channels) and not layers[0].image
            and isinstance(layers[1], nn.Conv1d))


def interleaved_rows(x: Tensor, rows: Tensor) -> Tensor:
    """`x[rows]` for `x` `[N, T, C]` (contiguous) and `rows` `[G, B]`: `[G, B, T, C]`, laid out
    as `[B, T, G, C]` in memory -- one gather of `C`-float rows in the order `grouped_conv` reads
    them. The same values as `x.index_select(0, rows.reshape(-1))`, in another memory order."""
    n, t, c = x.shape
    g, b = rows.shape
    steps = torch.arange(t, device=rows.device)
    idx = (rows.T.unsqueeze(1) * t + steps.view(1, t, 1)).reshape(-1)   # [B, T, G]
    return x.view(n * t, c).index_select(0, idx).view(b, t, g, c).permute(2, 0, 1, 3)


def select_devices(x: Tensor, idx: Tensor) -> Tensor:
    """`x.index_select(0, idx)` (dim 0: the devices) kept in `x`'s memory order: an
    interleaved minibatch (`interleaved_rows`) stays interleaved."""
    order = list(memory_order(x))
    if order[0] == 0 or not x.permute(order).is_contiguous():
        return x.index_select(0, idx)
    back = sorted(range(x.dim()), key=order.__getitem__)
    return x.permute(order).index_select(order.index(0), idx).permute(back)


@contextlib.contextmanager
def blocked_convolutions() -> Iterator[None]:
    """While a lock-step program runs: `F.conv1d` and `F.conv2d` (what `nn.Conv1d`/`nn.Conv2d`
    call) on per-device weights are blocked as the module docstring says, and global average
    pools of per-device tensors are plain means."""
    global _ROUTING
    saved = F.conv1d, F.conv2d, F.adaptive_avg_pool1d, F.adaptive_avg_pool2d
    F.conv1d, F.conv2d = _routed(saved[0]), _routed(saved[1])  # type: ignore[assignment]
    F.adaptive_avg_pool1d = _pooled(saved[2], 1)  # type: ignore[assignment]
    F.adaptive_avg_pool2d = _pooled(saved[3], 2)  # type: ignore[assignment]
    _ROUTING += 1
    try:
        yield
    finally:
        _ROUTING -= 1
        (F.conv1d, F.conv2d,  # type: ignore[assignment]
         F.adaptive_avg_pool1d, F.adaptive_avg_pool2d) = saved


def routing_convolutions() -> bool:
    """Whether `blocked_convolutions` routes `F.conv1d`/`F.conv2d` now."""
    return _ROUTING > 0
