"""Deterministic fault injection: who crashes, which hosts die, who misses the deadline.

Each decision is a pure function of (fault seed, round, unit), so the same fault seed gives the
same faults on every executor and after a resume.
"""

from __future__ import annotations

import numpy as np

from raymm import seeding
from raymm.config.schema import FaultSpec

HOST_UNIT_OFFSET = 1 << 40  # keeps host streams apart from device streams


def fault_seed(spec: FaultSpec, scenario_seed: int) -> int:
    return scenario_seed if spec.seed is None else spec.seed


def device_crashes(spec: FaultSpec, seed: int, t: int, devices: np.ndarray) -> np.ndarray:
    """bool per device: crashes before returning its update this round."""
    if spec.device_crash_prob <= 0:
        return np.zeros(len(devices), dtype=bool)
    return np.array([seeding.rng(seed, t, int(d), "fault:crash").random() < spec.device_crash_prob
                     for d in devices], dtype=bool)


def host_kills(spec: FaultSpec, seed: int, t: int, n_hosts: int) -> np.ndarray:
    """bool per host (DeviceActor): dies in the middle of this round's training."""
    if spec.actor_kill_prob <= 0:
        return np.zeros(n_hosts, dtype=bool)
    return np.array([seeding.rng(seed, t, HOST_UNIT_OFFSET + h, "fault:kill").random()
                     < spec.actor_kill_prob for h in range(n_hosts)], dtype=bool)


def stragglers(spec: FaultSpec, seconds: np.ndarray) -> np.ndarray:
    """bool per device: its simulated round time exceeds the deadline."""
    if spec.deadline_seconds is None:
        return np.zeros(seconds.shape[0], dtype=bool)
    return seconds > spec.deadline_seconds


def summary_line(row: dict) -> str | None:
    """One line for a round that had faults (None for a clean round): what the run lost."""
    parts = []
    if row.get("actors_killed"):
        parts.append(f"{row['actors_killed']} device host(s) died ({row.get('lost', 0)} "
                     "selected devices lost)")
    if row.get("failed"):
        parts.append(f"{row['failed']} device(s) crashed")
    if row.get("departed"):
        parts.append(f"{row['departed']} device(s) left before finishing")
    if row.get("stragglers"):
        parts.append(f"{row['stragglers']} straggler(s) " + (
            "still working at the round's end" if "sim_start_seconds" in row
            else "past the deadline"))
    if not parts:
        return None
    return f"round {row['round']}: " + ", ".join(parts) + \
        f"; {row.get('participated', 0)} of {row.get('selected', 0)} selected contributed"
