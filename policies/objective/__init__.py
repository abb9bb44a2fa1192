"""Local objectives (the loss a selected device minimises)."""

from policies.objective import ce  # noqa: F401
from policies.objective import tide  # noqa: F401
