"""Aggregation policies (how updates combine)."""

from policies.aggregation import delta_mean, fedavg, scaffold, ssca  # noqa: F401
