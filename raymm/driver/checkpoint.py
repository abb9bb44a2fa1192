"""Checkpoints: everything needed to continue a run exactly, as data that cannot run code.

A checkpoint holds the server state (parameter groups, observations, aggregator state such as
prototypes or cluster models, traffic and time counters), every device's local state, the round
counter and the metric history. No RNG state is needed: every draw comes from a stream named by
(seed, round, device, purpose), so round t+1 draws the same numbers whether or not the process
restarted in between.

Each is one file, `checkpoints/round-XXXXXX.safetensors` (`raymm.io.statefile`: arrays as
tensors, the rest JSON, a format version and a SHA-256), written atomically. Run directories
move between machines and people, so reading one back never unpickles anything: checkpoints of
raymm 0.1 (`round-*.pkl`) are refused with a message, never loaded. Resuming takes the newest
checkpoint that verifies and says which newer ones it skipped and why.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from raymm.errors import ResumeError
from raymm.io import statefile
from raymm.io.atomic import atomic_output
from raymm.io.paths import CONFIG_FILE
from raymm.sim.engine import Executor

KIND = "raymm-checkpoint"
DIRNAME = "checkpoints"
SUFFIX = ".safetensors"
_NAME = re.compile(r"round-(\d{6,})\.safetensors")


@dataclass(frozen=True)
class Checkpoint:
    round: int
    scenario_digest: str
    server: dict[str, Any]
    hosts: dict[int, Any]
    rows: list[dict[str, Any]]
    wall_seconds: float
    selected: dict[int, Any] = field(default_factory=dict)  # round -> selected ids (pictures)


def _core(config: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in config.items() if k not in ("execution", "output")}


def _digest(core: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(core, sort_keys=True, default=str).encode()).hexdigest()


def scenario_digest(config: dict[str, Any]) -> str:
    """Identity of a run's scenario: everything but where and how it executes."""
    return _digest(_core(config))


def _earlier_digests(config: dict[str, Any]) -> list[str]:
    """The digests a checkpoint written while the training engine's switches sat under
    `training` (`raymm.config.renamed`) holds for this scenario: they were part of its identity
    then; with and without `closed_form`, which came later than the others."""
    engine = config.get("execution", {}).get("training")
    core = _core(config)
    if not isinstance(engine, dict) or not isinstance(core.get("training"), dict):
        return []
    then = {"threads": engine.get("threads"), "vectorise_chunk": engine.get("chunk"),
            "vectorise": engine.get("path") == "lockstep"}
    return [_digest({**core, "training": {**core["training"], **then, **extra}})
            for extra in ({"closed_form": engine.get("closed_form")}, {})]


def is_of(config: dict[str, Any], digest: str) -> bool:
    """Whether a checkpoint's scenario digest is this scenario's (or its digest from before the
    engine's switches moved)."""
    return digest == scenario_digest(config) or digest in _earlier_digests(config)


def path_of(run_dir: Path, round: int) -> Path:
    return run_dir / DIRNAME / f"round-{round:06d}{SUFFIX}"


def save(run_dir: Path, ckpt: Checkpoint, keep: int = 2) -> Path:
    """Write the round's checkpoint via a temporary file and a rename, then keep the newest
    `keep` (older pickled ones are left alone: they are the user's to delete)."""
    path = path_of(run_dir, ckpt.round)
    data = statefile.to_bytes(dict(ckpt.__dict__), KIND, {"round": str(ckpt.round)})
    with atomic_output(path) as f:
        f.write(data)
    for _, old in candidates(run_dir)[keep:]:
        old.unlink()
    return path


def candidates(run_dir: Path) -> list[tuple[int, Path]]:
    """(round, path) of every checkpoint file, newest first."""
    folder = run_dir / DIRNAME
    found = [(int(m.group(1)), p) for p in folder.glob(f"round-*{SUFFIX}")
             if (m := _NAME.fullmatch(p.name))] if folder.is_dir() else []
    return sorted(found, reverse=True)


def latest(run_dir: Path) -> Path | None:
    found = candidates(run_dir)
    return found[0][1] if found else None


def read(path: Path) -> Checkpoint:
    """One checkpoint file, verified; StateFormatError says why it cannot be used."""
    if not path.is_file():
        raise statefile.StateFormatError("not a regular file")
    state, _ = statefile.read(path, KIND)
    if not isinstance(state, dict) or set(state) != set(Checkpoint.__dataclass_fields__):
        raise statefile.StateFormatError("does not hold a checkpoint's fields")
    ok = (isinstance(state["round"], int) and not isinstance(state["round"], bool)
          and state["round"] >= 0 and isinstance(state["scenario_digest"], str)
          and isinstance(state["server"], dict) and isinstance(state["hosts"], dict)
          and isinstance(state["rows"], list) and all(isinstance(r, dict) for r in state["rows"])
          and isinstance(state["wall_seconds"], (int, float))
          and isinstance(state["selected"], dict))
    if not ok:
        raise statefile.StateFormatError("a checkpoint field has the wrong type")
    return Checkpoint(**state)


def _stderr(msg: str) -> None:
    print(f"raymm: {msg}", file=sys.stderr, flush=True)


def load(run_dir: Path, say: Callable[[str], None] = _stderr) -> Checkpoint:
    """The newest checkpoint of a run directory that verifies, or a ResumeError saying why
    there is none. Newer ones that fail verification are reported through `say`."""
    if not run_dir.is_dir():
        raise ResumeError(f"--resume: {run_dir} is not a directory")
    if not (run_dir / CONFIG_FILE).is_file():
        raise ResumeError(f"--resume: {run_dir} is not a raymm run directory (no {CONFIG_FILE})")
    failed: list[str] = []
    for _, path in candidates(run_dir):
        try:
            ckpt = read(path)
        except (statefile.StateFormatError, OSError) as exc:
            failed.append(f"{path.name}: {exc}")
            continue
        if failed:
            say(f"skipped checkpoint(s) that do not verify: {'; '.join(failed)}; resuming "
                f"from {path.name} (round {ckpt.round})")
        return ckpt
    pickled = sorted((run_dir / DIRNAME).glob("round-*.pkl")) if (run_dir / DIRNAME).is_dir() \
        else []
    old = (f"; {len(pickled)} pickled checkpoint(s) of raymm 0.1 ({pickled[-1].name}, ...) are "
           "not read: a pickle can run code when loaded. Rerun the scenario, or resume it with "
           "the raymm version that wrote them") if pickled else ""
    if failed:
        raise ResumeError(f"--resume: no checkpoint in {run_dir} verifies: "
                          f"{'; '.join(failed)}{old}")
    if pickled:
        raise ResumeError(f"--resume: {run_dir} has no checkpoint this raymm reads{old}")
    raise ResumeError(f"--resume: {run_dir} has no checkpoint to resume from (set "
                      "output.checkpoint_every, or stop a run with Ctrl-C to write one)")


def restore(executor: Executor, ckpt: Checkpoint, run_dir: Path) -> None:
    """Give an executor the checkpoint's server and device state. A checkpoint verifies only
    that it is intact; one whose content does not fit the state this raymm keeps (written by
    another version, or crafted) is a ResumeError, not a traceback from deep in a policy."""
    try:
        executor.load_server_state(ckpt.server)
        executor.load_host_states(ckpt.hosts)
    except Exception as exc:  # noqa: BLE001 - any mismatch is the same user problem
        raise ResumeError(f"--resume: the checkpoint of round {ckpt.round} in {run_dir} does "
                          f"not fit this scenario's state ({type(exc).__name__}: {exc})"
                          ) from None
