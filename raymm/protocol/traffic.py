"""Which groups each device receives and sends, what that costs in bytes and simulated time.

Both the device side (what to train) and the server side (what to count) call these, so the
traffic counted is exactly the traffic a device's training used.
"""

from __future__ import annotations

import numpy as np

from raymm.models.network import SHARED
from raymm.units import FLOAT_BYTES


def device_groups(held: np.ndarray, sensors: tuple[str, ...], active: tuple[str, ...],
                  upload: str) -> list[str]:
    """Groups a device with sensor mask `held` receives, trains and uploads this round.

    `upload="all"`: every active group (plain FedAvg on a multimodal model: a device without
    sensor m still trains θ_m on zero inputs). `upload="held"`: active groups of the sensors it
    holds, plus `shared`.
    """
    out = []
    for g in active:
        if g == SHARED or upload == "all":
            out.append(g)
        elif g.startswith("sensor:") and held[sensors.index(g[len("sensor:"):])]:
            out.append(g)
    return out


def group_receivers(mask: np.ndarray, sensors: tuple[str, ...], active: tuple[str, ...],
                    upload: str) -> dict[str, np.ndarray]:
    """Vectorised `device_groups` over a device × sensor mask: group -> bool [n]."""
    n = mask.shape[0]
    out = {}
    for g in active:
        if g == SHARED or upload == "all":
            out[g] = np.ones(n, dtype=bool)
        else:
            out[g] = mask[:, sensors.index(g[len("sensor:"):])].copy()
    return out


def downlink_bytes(mask: np.ndarray, sensors: tuple[str, ...], active: tuple[str, ...],
                   upload: str, sizes: dict[str, int], frozen_bytes: int = 0) -> np.ndarray:
    """Bytes each device (row of `mask`) is sent: its groups, plus `frozen_bytes` per missing
    sensor (the constant zero-input embedding a pod-wise device needs from branches it lacks)."""
    recv = group_receivers(mask, sensors, active, upload)
    total = np.zeros(mask.shape[0], dtype=np.int64)
    for g, who in recv.items():
        total += who.astype(np.int64) * sizes[g] * FLOAT_BYTES
    if upload == "held" and SHARED in active:
        total += (~mask).sum(axis=1).astype(np.int64) * frozen_bytes
    return total


def comm_seconds(bytes_down: np.ndarray, bytes_up: np.ndarray, down_bps: np.ndarray,
                 up_bps: np.ndarray) -> np.ndarray:
    return bytes_down / down_bps.astype(np.float64) + bytes_up / up_bps.astype(np.float64)


def compute_seconds(num_samples: np.ndarray, epochs: int, flops_per_sample: float,
                    gflops: np.ndarray) -> np.ndarray:
    """Simulated local-training time: epochs × samples × FLOPs per sample / device speed."""
    return epochs * num_samples.astype(np.float64) * flops_per_sample / (
        gflops.astype(np.float64) * 1e9)


def forward_seconds(num_samples: np.ndarray, passes: np.ndarray | int, flops_per_sample: float,
                    gflops: np.ndarray) -> np.ndarray:
    """Simulated time of `passes` forward passes over each device's samples (e.g. a report of
    per-sensor accuracies): a forward pass is taken as a third of a training step's FLOPs (the
    backward pass costs about twice the forward)."""
    return np.asarray(passes, np.float64) * num_samples.astype(np.float64) * (
        flops_per_sample / 3.0) / (gflops.astype(np.float64) * 1e9)
