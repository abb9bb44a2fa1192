"""When a lock-step program cannot run, or raises: why an objective or model cannot train in
lock-step at all (`why_not_lockstep`), and strict mode (`RAYMM_STRICT_LOCKSTEP=1`), under
which a program that falls back to sequential training stops the run instead
(`LockstepFallback`): a fast path must not fail in silence in the tests and the reference runs.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import torch

from raymm.protocol.seams import Objective

#: set to 1, a lock-step program that falls back to sequential training stops the run (the
#: tests and the reference runs set it: a fast path must not fail in silence there)
STRICT_VAR = "RAYMM_STRICT_LOCKSTEP"


def strict() -> bool:
    """Whether a fallback is an error here (`STRICT_VAR`), read at each call so a test can
    switch it."""
    return os.environ.get(STRICT_VAR, "") == "1"


class LockstepFallback(RuntimeError):
    """Lock-step programs fell back to sequential training under `strict` mode (one
    message argument: it crosses Ray's process boundary as it is)."""


def fallback_error(where: str, fallbacks: Mapping[str, int]) -> LockstepFallback:
    """The error that stops a strict run: where, and each reason with its devices."""
    reasons = "; ".join(f"{n} device(s): {why}" for why, n in sorted(fallbacks.items()))
    return LockstepFallback(f"{where}: lock-step training fell back to the sequential path "
                            f"({reasons}); {STRICT_VAR}=1 makes that an error")


def why_not_lockstep(objective: Objective, model: torch.nn.Module | None = None) -> str | None:
    """The reason this objective/model cannot train in lock-step, or None when it can."""
    if not objective.vectorisable:
        return (f"objective {type(objective).__name__} does not declare `vectorisable = True` "
                "(see raymm.training.lockstep for what that promises)")
    if objective.overrides(Objective.local_steps):
        return (f"objective {type(objective).__name__} has an update rule of its own "
                "(`local_steps`): sequential path only")
    if model is not None and any(True for _ in model.buffers()):
        return "the model has buffers (e.g. batch norm); only parameter-only models are vmapped"
    return None
