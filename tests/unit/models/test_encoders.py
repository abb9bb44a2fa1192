"""Per-sensor encoders (raymm.models.encoders): ResNet-18 (torchvision, GroupNorm) embeds any
image, refuses vectors, and trains in lock-step as sequentially."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from raymm.models.encoders import make_encoder

from helpers import host_round


@pytest.mark.parametrize("shape", [(28, 28), (40, 65), (3, 32, 32)],
                         ids=["grey-frame", "spectrogram", "rgb-frame"])
def test_resnet18_encoder_embeds_any_image_and_keeps_no_buffers(shape):
    torch.manual_seed(0)
    enc = make_encoder("resnet18", shape, embed_dim=24, hidden=0)
    out = enc(torch.randn(2, *shape))
    assert out.shape == (2, 24) and bool((out >= 0).all())   # ReLU'd like every encoder
    # GroupNorm instead of batch norm: no running statistics, every tensor is a parameter
    assert list(enc.buffers()) == []
    assert not any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in enc.modules())
    n = sum(p.numel() for p in enc.parameters())
    stem = 64 * (1 if len(shape) == 2 else 3) * 49
    assert n == 11_176_512 - 3 * 64 * 49 + stem + (512 * 24 + 24)   # ResNet-18 trunk + stem + map


def test_resnet18_refuses_vectors():
    with pytest.raises(ValueError, match="resnet18 needs"):
        make_encoder("resnet18", (16,), embed_dim=8, hidden=0)


@pytest.mark.lockstep_fallback
def test_resnet18_trains_in_lock_step_as_sequentially():
    """No buffers, so a ResNet model goes to lock-step like any other; but torch's GroupNorm
    asks, under vmap, whether its input is contiguous in another memory format, which vmap
    does not implement: every program falls back, counted, and the round gives the
    sequential round's updates."""
    seq, vec, plan, bcast = host_round(
        {}, **{"dataset.sensors.a": {"dim": 12, "length": 16, "informativeness": 1.0},
               "model.encoders": {"a": "resnet18"}, "training.batch_size": 8})
    assert vec.lockstep is not None                 # a lock-step host, not sequential by design
    a, b = seq.train(plan, bcast), vec.train(plan, bcast)
    (why, n), = b.lockstep_fallbacks.items()
    assert n == b.device_ids.size and "is_contiguous inside of vmap" in why
    assert a.device_ids.tolist() == b.device_ids.tolist()
    for g in a.updates:
        np.testing.assert_allclose(b.updates[g], a.updates[g], rtol=0, atol=1e-4, err_msg=g)
