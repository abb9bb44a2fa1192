"""Selection policies (who trains)."""

from policies.selection import basic  # noqa: F401
