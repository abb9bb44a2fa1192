"""Aggregation policies (how updates combine)."""

from policies.aggregation import fedavg, trimmed_mean  # noqa: F401
