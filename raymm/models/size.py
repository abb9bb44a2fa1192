"""How big a model is before it is built: parameters counted on torch's meta device (a huge
setting is a message, not an out-of-memory kill) and the FLOPs of one training sample.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from raymm.config.schema import ModelSpec
from raymm.data.base import Dataset
from raymm.models.factory import ModelContext, build_from_factory
from raymm.models.network import RaymmNet
from raymm.units import FLOAT_BYTES, GIB

#: parameters of the model (float32) past which a scenario is refused before anything is
#: built: 4 GiB per copy
MAX_MODEL_PARAMS = 1 << 30


def model_size_problem(model: torch.nn.Module, what: str = "model") -> str | None:
    """A model whose float32 parameters alone would need more than 4 GiB per copy."""
    n = sum(p.numel() for p in model.parameters())
    if n > MAX_MODEL_PARAMS:
        return (f"{what}: {n:,} parameters ({n * FLOAT_BYTES / GIB:.1f} GiB per copy) is more "
                f"than this simulator allows ({MAX_MODEL_PARAMS:,}); lower model.embed_dim, "
                "model.hidden or model.fusion_dim")
    return None


def model_problem(sensors: tuple[str, ...], shapes: Mapping[str, tuple[int, ...]],
                  num_classes: int, spec: ModelSpec) -> str | None:
    """`model_size_problem` of the scenario's model for data of these sensors, input shapes
    and classes (a loaded `Dataset`'s, or a loader's `DataFacts` before any loading), built by
    its factory on torch's meta device (shapes only, no memory)."""
    ctx = ModelContext(sensors, {m: tuple(shapes[m]) for m in sensors}, num_classes, spec)
    with torch.device("meta"):
        net = build_from_factory(ctx)
    return model_size_problem(net)


def flops_per_sample(model: RaymmNet, dataset: Dataset) -> float:
    """Forward + backward FLOPs of one training sample, counted by torch (deterministic). The
    model's buffers (batch norm's statistics) are left as they were."""
    xs = {m: torch.zeros((2,) + dataset.sensor_shape(m)) for m in dataset.sensors}
    present = torch.ones(2, len(dataset.sensors))
    buffers = {n: b.detach().clone() for n, b in model.named_buffers()}
    with FlopCounterMode(display=False) as counter:
        out = model(xs, present, use_adapter=model.adapter is not None)
        F.cross_entropy(out.logits, torch.zeros(2, dtype=torch.long)).backward()
    model.zero_grad(set_to_none=True)
    with torch.no_grad():
        for n, b in model.named_buffers():
            b.copy_(buffers[n])
    return max(float(counter.get_total_flops()) / 2.0, 1.0)
