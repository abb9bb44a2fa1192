"""User-facing errors (raymm.errors): every bad field of a scenario in one message, `refuse`
raises only when there is a problem, and an interrupted run says how to resume."""

from __future__ import annotations

import pytest

from raymm.errors import DataError, Interrupted, RaymmError, ResumeError, ScenarioError, refuse


def test_a_scenario_error_lists_every_problem_and_where() -> None:
    err = ScenarioError(["rounds: must be positive", "selection.k: too large"], "s.yaml")
    assert err.problems == ["rounds: must be positive", "selection.k: too large"]
    assert str(err) == ("invalid scenario in s.yaml:\n  - rounds: must be positive\n"
                        "  - selection.k: too large")
    assert str(ScenarioError(["x: bad"])) == "invalid scenario:\n  - x: bad"


def test_refuse_raises_only_with_problems() -> None:
    refuse([])
    problems = ["model.hidden: too large"]
    with pytest.raises(ScenarioError) as err:
        refuse(problems)
    assert err.value.problems == problems and err.value.problems is not problems


def test_every_user_error_is_a_raymm_error_and_interrupted_says_how_to_resume() -> None:
    for cls in (ScenarioError, DataError, ResumeError, Interrupted):
        assert issubclass(cls, RaymmError)
    err = Interrupted("runs/tiny-1", 7)
    assert (err.run_dir, err.last_round) == ("runs/tiny-1", 7)
    assert str(err).startswith("interrupted after round 7; checkpoint written.")
    assert str(err).endswith("Resume with: raymm run --resume runs/tiny-1")
