"""A sensor's encoder run for a lock-step program's devices at once, without `vmap`.

A lock-step step runs each sensor's encoder under `vmap` over the devices' stacked weights.
Underneath, vmap issues one physical call per layer on the stacked tensors -- the grouped
convolution of `lockstep_conv.grouped_conv`, one `bmm` per linear layer -- and autograd records
those calls. The wrapping around them (the module's `__call__`s, swapping weights in through
`ModuleCall`, vmap's batching rules and re-wrapping after each layer) is a real share of a
small encoder's forward and backward (docs/performance.md, "Encoders run without vmap's
layers").

`LockstepEncoder` makes those physical calls itself, layer by layer, for an `nn.Sequential` of
the layers it knows (`Channels`, `Conv1d`/`Conv2d` with zero padding, `ReLU`, global average
pools and 2-D adaptive ones, `Flatten`, `Linear`): the same operations on the same tensors in
the same memory order, so the same bits forward and backward
(`tests/unit/training/_kernels/test_lockstep_encoder.py` holds every supported kind to the
vmapped call's bits; the reference runs hold whole trainings to them). Any other module, or
tensors under a further transform, run under `vmap` as before (`encode_devices`). A tensor here
carries its device axis at dim 0 (as given) or 1 (as a grouped convolution returns it), and
each device's own sample axis at the other.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch._C import _functorch as _ft
from torch.func import vmap

from raymm.models.encoders import Channels
from raymm.training._kernels.lockstep_conv import global_mean, grouped_conv, routing_convolutions
from raymm.training._kernels.module_call import ModuleCall

Params = Mapping[str, Tensor]
#: (params, physical tensor, its device axis, devices) -> (tensor, device axis)
Layer = Callable[[Params, Tensor, int, int], tuple[Tensor, int]]


def encode_devices(call: ModuleCall, encoder: nn.Module, params: Params, x: Tensor) -> Tensor:
    """`vmap(lambda p, xb: call.run(p, encoder, xb))(params, x)`: the devices' embeddings
    `[g, B, E]` of their inputs `x` `[g, B, *S]`, every tensor of `params` stacked per device
    (the same bits either way; see the module docstring)."""
    stacked = LockstepEncoder.of(call, encoder)
    if stacked is not None and (routing_convolutions() or not stacked.convolves) and \
            not any(_ft.is_functorch_wrapped_tensor(t) for t in (x, *params.values())):
        return stacked(params, x)
    return vmap(lambda p, xb: call.run(p, encoder, xb))(dict(params), x)


class LockstepEncoder:
    """An encoder's layers as physical calls on device-stacked tensors (module docstring)."""

    #: per call, its encoders' plans by the encoder's id (None: not supported); a plan holds
    #: no module, so a run's model goes when its call does
    _plans: weakref.WeakKeyDictionary[ModuleCall, dict[int, LockstepEncoder | None]] = \
        weakref.WeakKeyDictionary()

    def __init__(self, layers: list[Layer], convolves: bool) -> None:
        self.layers = layers
        #: whether a layer is a convolution, which vmap runs as this does only while
        #: `lockstep_conv.blocked_convolutions` routes them
        self.convolves = convolves

    @classmethod
    def of(cls, call: ModuleCall, encoder: nn.Module) -> LockstepEncoder | None:
        """The plan for `encoder` (a part of `call.model`), None where a layer is not one this
        module knows; made once per encoder."""
        plans = cls._plans.setdefault(call, {})
        if id(encoder) not in plans:   # `call.model` holds the encoder: its id stays its own
            plans[id(encoder)] = cls._plan(call, encoder)
        return plans[id(encoder)]

    @classmethod
    def _plan(cls, call: ModuleCall, encoder: nn.Module) -> LockstepEncoder | None:
        if not isinstance(encoder, nn.Sequential) or any(True for _ in encoder.buffers()):
            return None
        names = {(id(mod), attr): name for name, (mod, attr) in call.slots.items()}
        layers = []
        flat = False   # per device [B, features] (after a Flatten) rather than [B, C, *S]
        for layer in encoder:
            found = {attr: names.get((id(layer), attr)) for attr, _ in
                     layer.named_parameters(recurse=False)}
            if None in found.values() or any(True for _ in layer.children()):
                return None   # a parameter `call` does not swap in, or a nested module
            weights = {attr: name for attr, name in found.items() if name is not None}
            flat = flat or isinstance(layer, nn.Flatten)
            # a linear layer on per-device [B, F] rows only, a spatial one before a Flatten
            if flat != isinstance(layer, (nn.Flatten, nn.Linear)) and \
                    not isinstance(layer, nn.ReLU):
                return None
            made = _layer(layer, weights)
            if made is None:
                return None
            layers.append(made)
        return cls(layers, any(isinstance(m, (nn.Conv1d, nn.Conv2d)) for m in encoder))

    def __call__(self, params: Params, x: Tensor) -> Tensor:
        h, axis, g = x, 0, x.shape[0]
        for layer in self.layers:
            h, axis = layer(params, h, axis, g)
        return h if axis == 0 else h.transpose(0, 1)


def _layer(layer: nn.Module, names: dict[str, str]) -> Layer | None:
    """The physical call of one known layer, None for any other."""
    if isinstance(layer, Channels):
        image = layer.image

        def channels(p: Params, h: Tensor, axis: int, g: int) -> tuple[Tensor, int]:
            if image:   # a per-device [B, H, W] gains a channel axis
                return (h.unsqueeze(2) if h.dim() == 4 else h), axis
            return h.transpose(2, 3), axis   # per device [B, T, C] -> [B, C, T]
        return channels
    if isinstance(layer, (nn.Conv1d, nn.Conv2d)):
        if layer.padding_mode != "zeros" or isinstance(layer.padding, str):
            return None
        conf = ([int(s) for s in layer.stride], [int(s) for s in layer.padding],
                [int(s) for s in layer.dilation], layer.groups)
        weight, bias = names["weight"], names.get("bias")

        def conv(p: Params, h: Tensor, axis: int, g: int) -> tuple[Tensor, int]:
            b = p[bias] if bias is not None else None
            return grouped_conv(g, (axis, 0, 0 if b is not None else None), h, p[weight],
                                b, *conf)
        return conv
    if isinstance(layer, nn.ReLU) and not layer.inplace:
        return lambda p, h, axis, g: (h.relu(), axis)
    if isinstance(layer, (nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d)):
        dims = 1 if isinstance(layer, nn.AdaptiveAvgPool1d) else 2
        size: Any = layer.output_size
        sizes = [size] * dims if isinstance(size, int) else list(size)
        if sizes != [1] * dims:
            return _adaptive_pool(sizes) if dims == 2 and None not in sizes else None

        def pool(p: Params, h: Tensor, axis: int, g: int) -> tuple[Tensor, int]:
            # as `lockstep_conv._pooled` computes a global pool of per-device tensors, the
            # device axis first as vmap puts it for a sum (over two axes, their order of
            # accumulation follows the layout)
            return global_mean(h.movedim(axis, 0), dims), 0
        return pool
    if isinstance(layer, nn.Flatten):
        if layer.start_dim != 1 or layer.end_dim != -1:
            return None
        # the device axis first, as vmap's batching rule for a reshape puts it
        return lambda p, h, axis, g: (h.movedim(axis, 0).flatten(2) if h.dim() > 3 else
                                      h.movedim(axis, 0), 0)
    if isinstance(layer, nn.Linear):
        weight, bias = names["weight"], names.get("bias")

        def linear(p: Params, h: Tensor, axis: int, g: int) -> tuple[Tensor, int]:
            rows = h if axis == 0 else h.transpose(0, 1)          # [g, B, in]
            out = torch.bmm(rows, p[weight].transpose(1, 2))    # what vmap's linear runs
            return (out + p[bias].unsqueeze(1) if bias is not None else out), 0
        return linear
    return None


def _adaptive_pool(sizes: list[int]) -> Layer:
    """A 2-D adaptive average pool to `sizes` (not global) as vmap's batching rule runs it: the
    devices' samples made one contiguous batch, device axis first, pooled, viewed back."""
    def pool(p: Params, h: Tensor, axis: int, g: int) -> tuple[Tensor, int]:
        h = h.movedim(axis, 0)
        out = F.adaptive_avg_pool2d(h.reshape(-1, *h.shape[2:]), (sizes[0], sizes[1]))
        return out.view(*h.shape[:2], *out.shape[1:]), 0
    return pool
