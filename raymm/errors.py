"""User-facing errors: the CLI turns each into one clear message and exit code 2."""

from __future__ import annotations


class RaymmError(Exception):
    """Base class of errors caused by the user's input, not by a bug."""


class ScenarioError(RaymmError):
    """A scenario failed validation. `problems` lists every bad field at once."""

    def __init__(self, problems: list[str], source: str | None = None) -> None:
        self.problems = list(problems)
        self.source = source
        where = f" in {source}" if source else ""
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"invalid scenario{where}:\n{lines}")


def refuse(problems: list[str]) -> None:
    """Raise `ScenarioError(problems)` if there are any: what a policy's `bind` does with its
    own `check_scenario` problems, for a scenario that never went through `raymm validate`."""
    if problems:
        raise ScenarioError(problems)


class DataError(RaymmError):
    """A dataset file is missing, unreadable or has the wrong layout."""


class ResumeError(RaymmError):
    """A --resume directory is not a run of this scenario, or its checkpoint is unusable."""


class Interrupted(RaymmError):
    """Ctrl-C: the round in flight finished, a checkpoint was written, the run can resume."""

    def __init__(self, run_dir: object, last_round: int) -> None:
        self.run_dir, self.last_round = run_dir, last_round
        super().__init__(f"interrupted after round {last_round}; checkpoint written. "
                         f"Resume with: raymm run --resume {run_dir}")
