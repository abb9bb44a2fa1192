"""Selection policies (who trains)."""

from policies.selection import basic  # noqa: F401
from policies.selection import tide  # noqa: F401
