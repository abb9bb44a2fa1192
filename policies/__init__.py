"""Pluggable decisions: selection, aggregation, schedules, local objectives, and presets.

Importing this package registers every policy in `raymm.protocol.registry`. Never imports Ray.

May import: base, io, config, data, models, population, protocol.
"""

from __future__ import annotations

# examples: the worked examples of docs/adding-a-policy.md, registered as any other policy
from policies import aggregation, examples, objective, schedule, selection  # noqa: F401
from policies.presets import METHODS, PRESETS

__all__ = ["METHODS", "PRESETS"]
