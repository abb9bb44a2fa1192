"""The worked examples of docs/adding-a-policy.md: real, registered policies, small enough to
read whole, run by tests/unit/test_example_policies.py (and, as every registered policy, by
tests/integration/test_every_policy.py on the serial executor, on Ray and across a resume)."""

from policies.examples import adaptive_prox, clipped_delta  # noqa: F401  (import registers)
