"""Selection policies (who trains)."""

from policies.selection import basic, bmsfed, fair, fraction, tide  # noqa: F401
