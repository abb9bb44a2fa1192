"""Named methods: bundles of policy and model choices a scenario selects with `method:`.

A scenario's own keys override the preset's. Adding a method = a policy module (if it needs a
new decision) + one entry here. The tables are `raymm.protocol.registry`'s, which a plugin fills
with `register_preset` (after these).
"""

from __future__ import annotations

from raymm.config.schema import deep_merge
from raymm.protocol.registry import METHODS, PRESETS

__all__ = ["METHODS", "PRESETS"]  # filled here; `policies` re-exports them

PRESETS.update({
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
    # loss, modality dropout, a device-local residual adapter that learns on its own path and
    # moves no global parameter (objective.adapter_path: personal; see policies/objective/
    # tide.py); Adam 1e-3; early stop after 10 evaluations without improvement (evaluated every
    # 10 rounds)
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
    # (experiments/tide/ablations/). The adapter stays, as in every TIDE row, on its own path.
    "tide_core": {
        "selection": {"name": "tide"},
        "aggregation": {"name": "tide"},
        "schedule": {"name": "joint"},
        "objective": {"name": "tide", "lambda_cs": 0.0, "lambda_p": 0.0, "lambda_h": 0.0},
        "model": {"aux_heads": False, "adapter": True},
        "training": {"upload": "all", "optimizer": "adam", "lr": 1e-3},
        "eval": {"every": 10, "early_stop_patience": 10},
    },
})

# ------------------------------------------------------------------ FedMChain and its baselines
# All evaluate every device on its own 80/20 split (ACC, per tier, ACC_m, MIR) and sample 70% of
# the eligible online devices per round, as the FedMChain paper does.
_PER_DEVICE: dict[str, dict[str, object]] = {
    "selection": {"name": "fraction", "fraction": 0.7},
    "population": {"local_test_fraction": 0.2},
    "eval": {"scope": "devices"},
    "model": {"fusion": "sum_logits"},
}

PRESETS["fedmchain"] = deep_merge(_PER_DEVICE, {
    # MCFT: one modality per phase (chain = the dataset's sensor order unless schedule.chain)
    "schedule": {"name": "modality_chain"},
    "objective": {"name": "mcft", "lambda_a": 0.4, "lambda_c": 1.0, "tau": 0.1},
    # SSCA with K cluster models per modality, synced every υ rounds
    "aggregation": {"name": "ssca", "kappa": 0.7, "clusters": 5, "pi": 0.9,
                    "lambda_merge": 0.9},
    "training": {"upload": "held", "exchange": "delta", "sync_every": 20},
})
# ablations: one component removed each
PRESETS["fedmchain_wo_mcft"] = deep_merge(PRESETS["fedmchain"], {
    "schedule": {"name": "joint"}, "objective": {"name": "ce"}})
PRESETS["fedmchain_wo_ssca"] = deep_merge(PRESETS["fedmchain"], {
    "aggregation": {"name": "delta_mean"}})
PRESETS["fedmchain_wo_ra"] = deep_merge(PRESETS["fedmchain"], {"objective": {"lambda_a": 0.0}})
PRESETS["fedmchain_wo_rc"] = deep_merge(PRESETS["fedmchain"], {"objective": {"lambda_c": 0.0}})
PRESETS["fedmchain_wo_rarc"] = deep_merge(PRESETS["fedmchain"], {
    "objective": {"lambda_a": 0.0, "lambda_c": 0.0}})

# classic baselines, joint training of every branch (every device trains and returns every
# group, as plain FedAvg does on a multimodal model)
PRESETS["scaffold"] = deep_merge(_PER_DEVICE, {
    "aggregation": {"name": "scaffold"}, "schedule": {"name": "joint"},
    "objective": {"name": "scaffold"}, "training": {"upload": "all"}})
# Local: every device trains its own model on its own data and never communicates
PRESETS["local"] = deep_merge(_PER_DEVICE, {
    "aggregation": {"name": "fedavg"}, "schedule": {"name": "joint"},
    "objective": {"name": "ce"}, "training": {"upload": "held", "exchange": "none"}})

# ------------------------------------------------------------------ baselines both papers compare
# Harmony (MobiSys'23): modality-wise FL (each sensor's unimodal network averaged over its pod),
# then federated fusion learning among multimodal devices; uniform random selection, as the
# TIDE paper runs it. docs/methods/harmony.md
PRESETS["harmony"] = {
    "selection": {"name": "random"},
    "aggregation": {"name": "harmony"},
    "schedule": {"name": "harmony"},
    "objective": {"name": "harmony"},
    "model": {"aux_heads": True},
    "training": {"upload": "held"},
}
# FedProto (AAAI'22): every device keeps its own model; only class prototypes travel; each
# device is evaluated with its own model (and by nearest prototype). docs/methods/fedproto.md
PRESETS["fedproto"] = {
    "selection": {"name": "random"},
    "aggregation": {"name": "fedproto"},
    "schedule": {"name": "joint"},
    "objective": {"name": "fedproto", "lam": 1.0},
    "training": {"upload": "held", "exchange": "personal"},
    "population": {"local_test_fraction": 0.2},
    "eval": {"scope": "devices"},
}
# Adaptive server optimizers (Reddi et al., ICLR'21) on FedAvg's local training: the mean update
# is the server's pseudo-gradient. docs/methods/fedopt.md
for _name in ("fedadam", "fedyogi", "fedadagrad"):
    PRESETS[_name] = deep_merge(PRESETS["fedavg"], {"aggregation": {"name": _name}})

# Asynchronous aggregation on a simulated clock (raymm.sim.async_loop; docs/methods/async.md):
# C devices in flight, random among the available ones when a slot frees; `rounds` counts
# server steps. FedBuff: a step every M arrivals, stale updates discounted by 1/sqrt(1+s).
# FedAsync: every arrival mixed in with weight alpha*(1+s)^-0.5. The discount's a and b are
# left unset so that choosing another function takes that function's own defaults.
PRESETS["fedbuff"] = deep_merge(PRESETS["fedavg"], {"aggregation": {
    "name": "fedbuff", "concurrency": 10, "buffer": 5, "server_lr": 1.0, "staleness": "poly"},
    "clock": {"mode": "seconds"}})
PRESETS["fedasync"] = deep_merge(PRESETS["fedavg"], {"aggregation": {
    "name": "fedasync", "concurrency": 10, "alpha": 0.6, "staleness": "poly"},
    "clock": {"mode": "seconds"}})

#: the methods `raymm sweep --methods all` runs (named methods; ablations are left out)
METHODS.extend(["fedavg", "fedprox", "scaffold", "local", "tide", "fedmchain", "harmony",
                "fedproto", "fedadam", "fedyogi", "fedadagrad"])
