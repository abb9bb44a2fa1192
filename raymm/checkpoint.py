"""Checkpoints: everything needed to continue a run exactly, written atomically.

A checkpoint holds the server state (parameter groups, observations, aggregator state such as
prototypes or cluster models, traffic and time counters), every device's local state, the round
counter and the metric history. No RNG state is needed: every draw comes from a stream named by
(seed, round, device, purpose), so round t+1 draws the same numbers whether or not the process
restarted in between.
"""

from __future__ import annotations

import hashlib
import json
import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from raymm.errors import ResumeError
from raymm.files import atomic_output

FORMAT = 1
DIRNAME = "checkpoints"


@dataclass(frozen=True)
class Checkpoint:
    round: int
    scenario_digest: str
    server: dict[str, Any]
    hosts: dict[int, Any]
    rows: list[dict[str, Any]]
    wall_seconds: float
    selected: dict[int, Any] = field(default_factory=dict)  # round -> selected ids (pictures)


def scenario_digest(config: dict[str, Any]) -> str:
    """Identity of a run's scenario: everything but where and how it executes."""
    core = {k: v for k, v in config.items() if k not in ("execution", "output")}
    return hashlib.sha256(json.dumps(core, sort_keys=True, default=str).encode()).hexdigest()


def save(run_dir: Path, ckpt: Checkpoint, keep: int = 2) -> Path:
    """Write `checkpoints/round-XXXXXX.pkl` via a temporary file and a rename, then prune."""
    folder = run_dir / DIRNAME
    folder.mkdir(exist_ok=True)
    path = folder / f"round-{ckpt.round:06d}.pkl"
    with atomic_output(path) as f:
        pickle.dump({"format": FORMAT, **ckpt.__dict__}, f, protocol=pickle.HIGHEST_PROTOCOL)
    for old in sorted(folder.glob("round-*.pkl"))[:-keep]:
        old.unlink()
    return path


def latest(run_dir: Path) -> Path | None:
    files = sorted((run_dir / DIRNAME).glob("round-*.pkl"))
    return files[-1] if files else None


def load(run_dir: Path) -> Checkpoint:
    """The newest complete checkpoint of a run directory, or a ResumeError saying why not."""
    if not run_dir.is_dir():
        raise ResumeError(f"--resume: {run_dir} is not a directory")
    if not (run_dir / "config.yaml").is_file():
        raise ResumeError(f"--resume: {run_dir} is not a raymm run directory (no config.yaml)")
    path = latest(run_dir)
    if path is None:
        raise ResumeError(f"--resume: {run_dir} has no checkpoint to resume from (set "
                          "output.checkpoint_every, or stop a run with Ctrl-C to write one)")
    try:
        with open(path, "rb") as f:
            data = pickle.load(f)
        data.pop("format")
        return Checkpoint(**data)
    except Exception as exc:  # noqa: BLE001 - any unreadable file is the same user problem
        raise ResumeError(f"--resume: checkpoint {path} is unreadable: {exc}") from None
