"""Process-level tuning for long-lived simulator actors (`raymm.sim.allocator`, shared with the
serial executor)."""

from __future__ import annotations

from raymm.sim.allocator import keep_freed_memory

__all__ = ["keep_freed_memory"]
