"""Schedules (which parameter groups are active each round)."""

from policies.schedule import joint  # noqa: F401
