"""Per-sensor encoders: input `[B, *shape]` -> embedding `[B, embed_dim]`.

The small kinds (mlp, cnn1d, cnn2d) are written here; `resnet18` is torchvision's ResNet-18 with
GroupNorm in place of batch norm, so the model keeps no running statistics: every parameter is a
trained weight that travels in the parameter groups, and lock-step training (torch.func over
stacked parameters) applies.
"""

from __future__ import annotations

import math

from torch import nn

#: channels per GroupNorm group in ResNet encoders (every ResNet width is a multiple of 32)
RESNET_GROUPS = 32


def auto_kind(shape: tuple[int, ...]) -> str:
    """Vectors get an MLP, `[T, C]` time series a 1D-CNN, `[H, W]` / `[C, H, W]` images a 2D-CNN."""
    if len(shape) == 1:
        return "mlp"
    if len(shape) == 2 and shape[0] >= 16 and shape[1] <= 16:
        return "cnn1d"
    return "cnn2d"


class Channels(nn.Module):
    """`[B, T, C]` -> `[B, C, T]` for Conv1d; `[B, H, W]` -> `[B, 1, H, W]` for Conv2d."""

    def __init__(self, image: bool) -> None:
        super().__init__()
        self.image = image

    def forward(self, x):  # noqa: ANN001, ANN201
        if self.image:
            return x.unsqueeze(1) if x.dim() == 3 else x
        return x.transpose(1, 2)


def embedding_dim(kind: str, shape: tuple[int, ...], embed_dim: int) -> int:
    """An `identity` encoder's embedding is its flattened input; every other kind's is
    `embed_dim`."""
    return math.prod(shape) if kind == "identity" else embed_dim


def resnet18(shape: tuple[int, ...], embed_dim: int) -> nn.Module:
    """ResNet-18 on `[H, W]` (spectrograms, grey frames: one channel) or `[C, H, W]` inputs.

    GroupNorm replaces BatchNorm (see the module docstring); the stem takes the input's channel
    count, and the classifier becomes a linear map to the embedding. Inputs as small as 28x28
    work (the global average pool absorbs what the strides leave).
    """
    # deferred: torchvision loads only for ResNet encoders
    from torchvision.models import resnet18 as tv_resnet18  # imported on use: torchvision is heavy

    if len(shape) not in (2, 3):
        raise ValueError(f"resnet18 needs [H, W] or [C, H, W] inputs, got shape {shape}")
    channels = 1 if len(shape) == 2 else shape[0]
    net = tv_resnet18(weights=None, num_classes=embed_dim,
                      norm_layer=lambda width: nn.GroupNorm(width // RESNET_GROUPS, width))
    if channels != 3:
        net.conv1 = nn.Conv2d(channels, 64, kernel_size=7, stride=2, padding=3, bias=False)
    return nn.Sequential(Channels(image=True), net, nn.ReLU())


def make_encoder(kind: str, shape: tuple[int, ...], embed_dim: int, hidden: int) -> nn.Module:
    if kind == "resnet18":
        return resnet18(shape, embed_dim)
    if kind == "identity":
        return nn.Flatten()
    if kind == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(shape), hidden), nn.ReLU(),
                             nn.Linear(hidden, embed_dim), nn.ReLU())
    if kind == "cnn1d":
        if len(shape) != 2:
            raise ValueError(f"cnn1d needs [T, C] inputs, got shape {shape}")
        channels = shape[1]
        return nn.Sequential(
            Channels(image=False),
            nn.Conv1d(channels, 16, kernel_size=5, stride=2, padding=2), nn.ReLU(),
            nn.Conv1d(16, 32, kernel_size=5, stride=2, padding=2), nn.ReLU(),
            nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(32, embed_dim), nn.ReLU())
    if kind == "cnn2d":
        if len(shape) not in (2, 3):
            raise ValueError(f"cnn2d needs [H, W] or [C, H, W] inputs, got shape {shape}")
        channels = 1 if len(shape) == 2 else shape[0]
        return nn.Sequential(
            Channels(image=True),
            nn.Conv2d(channels, 8, kernel_size=3, stride=2, padding=1), nn.ReLU(),
            nn.Conv2d(8, 16, kernel_size=3, stride=2, padding=1), nn.ReLU(),
            nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(64, embed_dim), nn.ReLU())
    raise ValueError(f"unknown encoder kind {kind!r}")
