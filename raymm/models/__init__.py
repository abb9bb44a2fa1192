"""Models: per-sensor encoders, fusion, heads, and their flat parameter groups."""

from __future__ import annotations

from raymm.models.layout import GroupLayout
from raymm.models.network import LOCAL, SHARED, ModelOutput, MultimodalNet, sensor_group

__all__ = ["GroupLayout", "LOCAL", "SHARED", "ModelOutput", "MultimodalNet", "sensor_group"]
