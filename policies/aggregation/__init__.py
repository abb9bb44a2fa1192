"""Aggregation policies (how updates combine)."""

from policies.aggregation import fedavg  # noqa: F401
from policies.aggregation import tide  # noqa: F401
