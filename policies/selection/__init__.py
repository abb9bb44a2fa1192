"""Selection policies (who trains)."""

from policies.selection import basic, fraction  # noqa: F401
