"""The staleness discounts asynchronous aggregators read (raymm.protocol.asynchrony)."""

import numpy as np

from raymm.protocol.asynchrony import discount


def test_discounts():
    s = np.array([0, 3, 8])
    assert np.allclose(discount("poly", s), 1 / np.sqrt(1 + s))
    assert np.allclose(discount("constant", s), 1)
    assert np.allclose(discount("hinge", s, a=0.5, b=4), [1, 1, 1 / (0.5 * 4 + 1)])
