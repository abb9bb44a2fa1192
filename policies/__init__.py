"""Pluggable decisions: selection, aggregation, schedules, local objectives, and presets.

Importing this package registers every policy in `raymm.registry`. Never imports Ray.
"""

from __future__ import annotations

from policies import aggregation, objective, schedule, selection  # noqa: F401  (registers)
from policies.presets import METHODS, PRESETS

__all__ = ["METHODS", "PRESETS"]
