"""Aggregation policies (how updates combine)."""

from policies.aggregation import (  # noqa: F401  (import registers)
    delta_mean,
    fedasync,
    fedavg,
    fedbuff,
    fedopt,
    fedproto,
    harmony,
    scaffold,
    ssca,
    tide,
    trimmed_mean,
)
