"""Local objectives (the loss a selected device minimises). `tide_closed_form` is TIDE's
lock-step fast path: importing it registers it under "tide" (`raymm.protocol.fast_paths`)."""

from policies.objective import (  # noqa: F401  (import registers)
    bmsfed,
    ce,
    fdarn,
    fedproto,
    flism,
    harmony,
    m3fed,
    mcft,
    scaffold,
    tide,
    tide_closed_form,
)
