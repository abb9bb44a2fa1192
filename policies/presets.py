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
    # TIDE: score selection, per-sensor encoders + aux heads merged within their pods (devices
    # upload only what they hold), shared fusion + head over all, prototypes, cross-sensor
    # loss, modality dropout, a device-local residual adapter; Adam 1e-3; early stop after 10
    # evaluations without improvement (evaluated every 10 rounds)
    "tide": {
        "selection": {"name": "tide"},
        "aggregation": {"name": "tide"},
        "schedule": {"name": "joint"},
        "objective": {"name": "tide"},
        "model": {"aux_heads": True, "adapter": True},
        "training": {"upload": "held", "optimizer": "adam", "lr": 1e-3},
        "eval": {"every": 10, "early_stop_patience": 10},
    },
    # the ablation's starting point: scores + plain averaging (every device trains and uploads
    # every group) + proximal term + modality dropout; no prototypes, no cross-sensor loss, no
    # aux heads. The ablation rows switch the components back on one at a time
    # (scenarios/tide_ablations/). The adapter stays, as in every TIDE row.
    "tide_core": {
        "selection": {"name": "tide"},
        "aggregation": {"name": "tide"},
        "schedule": {"name": "joint"},
        "objective": {"name": "tide", "lambda_cs": 0.0, "lambda_p": 0.0, "lambda_h": 0.0},
        "model": {"aux_heads": False, "adapter": True},
        "training": {"upload": "all", "optimizer": "adam", "lr": 1e-3},
        "eval": {"every": 10, "early_stop_patience": 10},
    },
}
