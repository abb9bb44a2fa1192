"""Aggregation policies (how updates combine)."""

from policies.aggregation import fedavg, tide, trimmed_mean  # noqa: F401
