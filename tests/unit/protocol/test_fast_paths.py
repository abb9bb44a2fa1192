"""Hand-written reverse passes (raymm.protocol.fast_paths) are found by the registered class of
the objective, and each name is registered once."""

from __future__ import annotations

import pytest

from policies.objective.ce import CEParams, CrossEntropy
from policies.objective.tide import TideObjective, TideObjectiveParams
from raymm.protocol.fast_paths import (
    CLOSED_FORMS,
    ClosedForm,
    closed_form_for,
    register_closed_form,
)


class _Subclass(CrossEntropy):
    """Not registered: a subclass may change `loss`, so it does not inherit `ce`'s step."""

def test_fast_paths_are_found_by_the_registered_class_of_the_objective():
    ce = closed_form_for(CrossEntropy(CEParams()))
    assert ce is CLOSED_FORMS["ce"] and ce.task_cross_entropy is not None
    assert ce.after_encoders is None
    assert closed_form_for(_Subclass(CEParams())) is None
    tide = closed_form_for(TideObjective(TideObjectiveParams()))
    assert tide is CLOSED_FORMS["tide"] and tide.task_cross_entropy is None
    with pytest.raises(ValueError, match="registered twice"):
        register_closed_form("ce", ClosedForm())
    register_closed_form("ce", ce)   # the same entry again: a module imported twice
