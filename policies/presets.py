"""Named methods: bundles of policy and model choices a scenario selects with `method:`.

A scenario's own keys override the preset's. Adding a method = a policy module (if it needs a
new decision) + one entry here.
"""

from __future__ import annotations

from typing import Any

PRESETS: dict[str, dict[str, Any]] = {
    # plain FedAvg on the multimodal model: every selected device trains and uploads every group
    "fedavg": {
        "selection": {"name": "random"},
        "aggregation": {"name": "fedavg"},
        "schedule": {"name": "joint"},
        "objective": {"name": "ce"},
        "training": {"upload": "all"},
    },
    # FedProx: FedAvg plus the proximal term µ/2·||θ - θ_t||²
    "fedprox": {
        "selection": {"name": "random"},
        "aggregation": {"name": "fedavg"},
        "schedule": {"name": "joint"},
        "objective": {"name": "ce", "mu": 0.01},
        "training": {"upload": "all"},
    },
}
