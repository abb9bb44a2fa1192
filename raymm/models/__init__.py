"""Models: per-sensor encoders, fusion and heads (`network`, `encoders`), their flat parameter
groups (`layout`), building the network every process starts from (`build`), its size before it
is built (`size`), the trained model a run saves and `raymm.load_model` reads (`saved`), and the
model under several sensor masks on the same inputs, as evaluation runs it (`masked`).

May import: base, io, config, data.
"""

from __future__ import annotations

from raymm.models.layout import GroupLayout
from raymm.models.network import LOCAL, SHARED, ModelOutput, MultimodalNet, RaymmNet, sensor_group

__all__ = ["GroupLayout", "LOCAL", "SHARED", "ModelOutput", "MultimodalNet", "RaymmNet",
           "sensor_group"]
