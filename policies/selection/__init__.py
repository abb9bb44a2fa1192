"""Selection policies (who trains)."""

from policies.selection import basic, fair, tide  # noqa: F401
