"""Local objectives (the loss a selected device minimises). `tide_closed_form` is TIDE's
lock-step fast path: importing it registers it under "tide" (`raymm.protocol.fast_paths`)."""

from policies.objective import ce, fedproto, harmony, mcft, scaffold, tide, tide_closed_form  # noqa: F401
