"""`tools/encoder_floor.py`: a step's encoder timed against its arithmetic."""

import torch
from torch.utils.flop_counter import FlopCounterMode

from raymm.training._kernels.lockstep_conv import blocked_convolutions

from helpers import REPO, load_script


def script():
    return load_script(REPO / "tools" / "encoder_floor.py")


def test_the_convolution_flops_are_what_torch_counts_for_one_step():
    """Forward, the weights' gradients and the second layer's input gradient (the first
    layer's input is data): torch's own counter over one device's plain encoder agrees."""
    s = script()
    encoder = s.make_encoder("cnn1d", s.SHAPE, s.EMBED, s.HIDDEN)
    x = torch.randn(7, *s.SHAPE)
    counter = FlopCounterMode(display=False)
    with counter:
        emb = encoder(x)
        torch.autograd.grad(emb.sum(), list(encoder.parameters()))
    counts = counter.get_flop_counts()["Global"]
    conv = sum(n for op, n in counts.items() if "convolution" in str(op))
    assert conv == s.conv_flops(encoder, 1, 7)
    assert s.conv_flops(encoder, 3, 7) == 3 * conv


def test_a_step_in_blocks_is_the_step_in_one_call_bit_for_bit():
    s = script()
    torch.manual_seed(0)
    g, b = 7, 4
    encoder = s.make_encoder("cnn1d", s.SHAPE, s.EMBED, s.HIDDEN)
    call = s.ModuleCall(encoder)
    params = {n: p.detach().expand(g, *p.shape) + 0.01 * torch.randn(g, *p.shape)
              for n, p in encoder.named_parameters()}
    x = torch.randn(g, b, *s.SHAPE)
    with blocked_convolutions():
        emb, grads = s.encoder_step(g, b, None, params, x, call, encoder)
        for per in (2, 3, 6):   # 6: a one-device rest, which joins the block before
            e2, g2 = s.encoder_step(g, b, per, params, x, call, encoder)
            assert torch.equal(e2, emb) and all(map(torch.equal, g2, grads)), per
    # and it is each device's own encoder: device 2 alone, outside lock-step
    own = s.ModuleCall(encoder)({n: t[2] for n, t in params.items()}, x[2])
    torch.testing.assert_close(emb[2], own, rtol=1e-5, atol=1e-6)
