"""Aggregation policies (how updates combine)."""

from policies.aggregation import (  # noqa: F401  (import registers)
    bmsfed,
    delta_mean,
    fedasync,
    fedavg,
    fedbuff,
    fedopt,
    fedproto,
    flism,
    harmony,
    m3fed,
    scaffold,
    ssca,
    tide,
    trimmed_mean,
)
