"""How fast a lock-step step's convolutional encoder runs, against the arithmetic it does.

    python tools/encoder_floor.py --devices 15 --blocks 5 8

builds the `cnn1d` encoder of `scenarios/tide_har.yaml` (128 x 3 windows, 3 -> 16 -> 32 channels,
kernel 5, stride 2), stacks its weights for G devices and runs it as a lock-step step does:
under `vmap` and `blocked_convolutions`, forward on a minibatch of every device, then the weights'
gradients. It prints the median milliseconds of that, the share of oneDNN's convolution kernels
in it (`torch.profiler`) and their rate in GFLOPS (the multiply-adds counted from the layer
shapes, forward and backward: the first layer takes no input gradient, its input is data).

A long-running process reuses its heap for these megabyte activations (glibc's thresholds adapt;
a `tide_har` round page-faults a few hundred times). A short loop like this one would instead
map and fault every fresh activation in, about half its time, so the script first keeps freed
memory in the heap as the serial executor does (`raymm.sim.allocator.keep_freed_memory`).

`--blocks N ...` also times the encoder run in blocks of about N devices (one call per block,
the embeddings concatenated), in turns with the one call; each block size is first checked to
give the same bits (embeddings and gradients). A kernel here runs on warm caches, a step's does
not: measure a change to a round with `paired_rounds.py`, not with this.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import Tensor
from torch.func import vmap
from torch.profiler import ProfilerActivity, profile

from raymm.models.encoders import make_encoder
from raymm.sim.allocator import keep_freed_memory
from raymm.training._kernels.lockstep_conv import blocked_convolutions
from raymm.training._kernels.module_call import ModuleCall

SHAPE, EMBED, HIDDEN = (128, 3), 32, 64


def conv_flops(encoder: torch.nn.Module, devices: int, batch: int) -> float:
    """Forward and backward FLOPs of the encoder's 1-D convolutions for one step, read off its
    layers: forward, the weights' gradient and, after the first layer, the input gradient."""
    total, length = 0.0, SHAPE[0]
    convs = [c for c in encoder.modules() if isinstance(c, torch.nn.Conv1d)]
    for i, c in enumerate(convs):
        (k,), (stride,), (pad,) = c.kernel_size, c.stride, c.padding
        length = (length + 2 * pad - k) // stride + 1
        macs = devices * batch * c.out_channels * length * c.in_channels * k
        total += 2 * macs * (3 if i else 2)
    return total


def encoder_step(devices: int, batch: int, blocks: int | None, params: dict[str, Tensor],
                 x: Tensor, call: ModuleCall, encoder: torch.nn.Module
                 ) -> tuple[Tensor, tuple[Tensor, ...]]:
    """The embeddings and the weights' gradients of one step, in blocks of about `blocks`."""
    leaves = {n: p.detach().requires_grad_(True) for n, p in params.items()}
    run = vmap(lambda p, xb: call.run(p, encoder, xb))
    per = blocks or devices
    starts = list(range(0, devices, per))
    if len(starts) > 1 and devices - starts[-1] < 2:
        starts.pop()     # no block of one device (a call holds at least two)
    sizes = [e - s for s, e in zip(starts, [*starts[1:], devices])]
    split = {n: t.split(sizes) for n, t in leaves.items()}
    parts = [run({n: split[n][i] for n in leaves}, xb) for i, xb in enumerate(x.split(sizes))]
    emb = torch.cat(parts) if len(parts) > 1 else parts[0]
    return emb, torch.autograd.grad((emb * emb).sum(), list(leaves.values()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--devices", type=int, default=15)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--blocks", type=int, nargs="*", default=[])
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    keep_freed_memory()   # as the serial executor does for a whole run
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    g, b = args.devices, args.batch
    encoder = make_encoder("cnn1d", SHAPE, EMBED, HIDDEN)
    call = ModuleCall(encoder)
    params = {n: p.detach().expand(g, *p.shape) + 0.01 * torch.randn(g, *p.shape)
              for n, p in encoder.named_parameters()}
    x = torch.randn(g, b, *SHAPE)
    variants: list[int | None] = [None, *args.blocks]
    with blocked_convolutions():
        ref = encoder_step(g, b, None, params, x, call, encoder)
        for n in args.blocks:
            emb, grads = encoder_step(g, b, n, params, x, call, encoder)
            same = torch.equal(emb, ref[0]) and all(map(torch.equal, grads, ref[1]))
            print(f"blocks of {n}: {'the same bits' if same else 'OTHER BITS'}")
        times: dict[int | None, list[float]] = {v: [] for v in variants}
        for _ in range(args.repeat):
            for v in variants:
                t = time.perf_counter()
                encoder_step(g, b, v, params, x, call, encoder)
                times[v].append(time.perf_counter() - t)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(args.repeat):
                encoder_step(g, b, None, params, x, call, encoder)
    conv_s = sum(e.self_cpu_time_total for e in prof.key_averages()
                 if e.key in ("aten::mkldnn_convolution", "aten::convolution_backward")
                 ) / 1e6 / args.repeat
    one = statistics.median(times[None])
    print(f"{g} devices x {b} samples: {one * 1e3:.2f} ms a step (median of {args.repeat}), "
          f"convolution kernels {conv_s * 1e3:.2f} ms at "
          f"{conv_flops(encoder, g, b) / conv_s / 1e9:.1f} GFLOPS")
    for n in args.blocks:
        print(f"  in blocks of {n}: {statistics.median(times[n]) * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
