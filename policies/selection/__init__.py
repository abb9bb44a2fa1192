"""Selection policies (who trains)."""

from policies.selection import basic, fair  # noqa: F401
