"""Local objectives (the loss a selected device minimises)."""

from policies.objective import ce, fedproto, harmony, mcft, scaffold, tide  # noqa: F401
