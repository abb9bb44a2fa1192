"""Selection policies (who trains)."""

from policies.selection import basic, fair, fraction, tide  # noqa: F401
