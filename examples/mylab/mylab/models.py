"""A model factory: the lab's own network, registered by name for `model: {factory: ...}`."""

from __future__ import annotations

import torch
from torch import nn

from raymm.models.factory import ModelContext, register_model


class WearableNet(nn.Module):
    """One small encoder per sensor (with batch norm), a fusion layer and a task head, plus a
    classifier per sensor: the parts pod-wise methods such as TIDE exchange sensor by sensor."""

    def __init__(self, ctx: ModelContext, width: int = 16) -> None:
        super().__init__()
        self.encoders = nn.ModuleDict({
            m: nn.Sequential(nn.Flatten(), nn.Linear(int(torch.Size(shape).numel()), width),
                             nn.BatchNorm1d(width), nn.ReLU())
            for m, shape in ctx.shapes.items()})
        self.fusion = nn.Sequential(nn.Linear(width * len(ctx.sensors), width), nn.ReLU())
        self.head = nn.Linear(width, ctx.num_classes)
        self.heads = nn.ModuleDict({m: nn.Linear(width, ctx.num_classes) for m in ctx.sensors})


@register_model("mylab_wearable")
def wearable(ctx: ModelContext) -> nn.Module:
    """`model: {factory: mylab_wearable, args: {width: 32}}`: `args` are the keywords."""
    return WearableNet(ctx, **ctx.args)
