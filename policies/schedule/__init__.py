"""Schedules (which parameter groups are active each round)."""

from policies.schedule import chain, joint  # noqa: F401
