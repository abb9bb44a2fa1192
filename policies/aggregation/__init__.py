"""Aggregation policies (how updates combine)."""

from policies.aggregation import fedavg  # noqa: F401
