"""Continuing a run from its newest checkpoint: which scenario, which state, which writer.

A resumed run ends with the same parameters and rounds table as an uninterrupted one: the
checkpoint holds every piece of state (`raymm.driver.checkpoint`), and the writer continues the
directory's history instead of starting a new one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from raymm.app.build import load_scenario
from raymm.config.schema import Scenario, read_yaml
from raymm.driver import checkpoint
from raymm.driver.rundir import RunWriter
from raymm.errors import ResumeError
from raymm.io.paths import CONFIG_FILE
from raymm.sim.engine import Executor, World


def resolve_resume(resume: str | Path,
                   scenario: str | Path | Mapping[str, Any] | Scenario | None,
                   overrides: Sequence[str]) -> tuple[Scenario, Path, checkpoint.Checkpoint]:
    """The saved scenario of a run directory and its newest checkpoint; a scenario given as
    well must be the same one (where and how it executes may differ)."""
    run_dir = Path(resume)
    ckpt = checkpoint.load(run_dir)
    saved = load_scenario(read_yaml(run_dir / CONFIG_FILE))
    if not checkpoint.is_of(saved.to_dict(), ckpt.scenario_digest):
        raise ResumeError(f"--resume: {run_dir}/{CONFIG_FILE} no longer matches its checkpoint")
    if scenario is not None or overrides:
        given = scenario if isinstance(scenario, Scenario) else load_scenario(
            scenario if scenario is not None else saved.to_dict(), overrides)
        if not checkpoint.is_of(given.to_dict(), ckpt.scenario_digest):
            raise ResumeError(f"--resume: {run_dir} is a run of another scenario "
                              f"({saved.name!r}); only execution.* and output.* may differ")
        saved = given
    return saved, run_dir, ckpt


def reopen(sc: Scenario, world: World, ex: Executor, ckpt: checkpoint.Checkpoint,
           run_dir: Path) -> RunWriter:
    """Give the started executor the checkpoint's state and reopen the run directory with
    its history up to the checkpoint (TensorBoard drops the events logged after it)."""
    checkpoint.restore(ex, ckpt, run_dir)
    writer = RunWriter(run_dir, None, sc.output.tensorboard, rows=ckpt.rows,
                       purge_step=ckpt.round + 1, budget_gib=sc.eval.budget_gib)
    writer.selected = dict(ckpt.selected)
    writer.class_names = tuple(world.dataset.class_names)
    return writer
