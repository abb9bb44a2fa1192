"""Schedules (which parameter groups are active each round)."""

from policies.schedule import chain, harmony, joint  # noqa: F401
