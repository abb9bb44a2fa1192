"""Least-selected-first selection (policies.selection.fair), by hand."""

import numpy as np

from policies.selection.fair import LeastSelected, LeastSelectedParams
from raymm.protocol.observations import Observations
from raymm.protocol.seams import SelectionContext


def test_least_selected_by_hand():
    obs = Observations.register(np.ones((6, 1), bool), np.zeros(6, np.int64))
    obs.times_selected[:] = [3, 0, 2, 0, 1, 5]
    ctx = SelectionContext(1, np.arange(6), np.array([0, 2, 3, 4, 5]), 3, obs,
                           np.random.default_rng(0))
    # device 1 is not eligible; fewest selections: 3 (0), 4 (1), 2 (2)
    assert LeastSelected(LeastSelectedParams()).select(ctx).tolist() == [2, 3, 4]
