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

# FedMultimodal (Feng et al., KDD'23, arXiv 2306.09486): attention fusion over the sensors'
# embeddings (absent sensors masked), FedAvg on the whole model, uniform random selection; the
# FedOpt row swaps in the server's Adam. docs/methods/fedmultimodal.md
PRESETS["fedmultimodal"] = deep_merge(PRESETS["fedavg"], {"model": {"fusion": "attention"}})
PRESETS["fedmultimodal_opt"] = deep_merge(PRESETS["fedmultimodal"], {
    "aggregation": {"name": "fedadam"}})
# GraMFedDHAR (Halder, Palit, Sen, arXiv 2509.05671): attention-weighted fusion (one weight per
# sensor), FedAvg, user-level DP on the aggregation (updates clipped at C = 1, Gaussian noise
# σ·C on the server's sum, σ = 1), TIDE's scores + participation term as TIDE's reproduction
# selected, Adam 1e-3. docs/methods/gramfeddhar.md
PRESETS["gramfeddhar"] = deep_merge(PRESETS["fedmultimodal"], {
    "model": {"attention_heads": 1},
    "selection": {"name": "tide_participation"},
    "privacy": {"mode": "central", "clip": 1.0, "noise_multiplier": 1.0},
    "training": {"optimizer": "adam", "lr": 1e-3}})

# BLOSSOM (M R, Chandwani, Abdelmoniem, Paul, IJCNN 2026, arXiv 2603.27552): block-wise
# aggregation, every block averaged over the devices that trained it (sensor encoders over the
# devices holding the sensor, fusion and head over all: FedAvg with upload: held). FM shares
# every block (the released code's default); PH keeps each device's head on the device, PHF
# its head and fusion layer (model.private), each device evaluated with its own.
# docs/methods/blossom.md
PRESETS["blossom"] = {
    "selection": {"name": "random"},
    "aggregation": {"name": "fedavg"},
    "schedule": {"name": "joint"},
    "objective": {"name": "ce"},
    "training": {"upload": "held"},
}
PRESETS["blossom_ph"] = deep_merge(PRESETS["blossom"], {
    "model": {"private": ["head"]},
    "population": {"local_test_fraction": 0.2},
    "eval": {"scope": "devices"}})
PRESETS["blossom_phf"] = deep_merge(PRESETS["blossom_ph"], {
    "model": {"private": ["head", "fusion"]}})

# FLISM (Orzikulova, Kwak, Shin, Lee, arXiv 2405.11828, version supcon_wavg_kd): CE +
# supervised contrastive loss against a sensor-dropped noisy second view + distillation from the
# unweighted mean of the last uploads; the main model weighted by 1/entropy; uniform random
# selection; λ_kd = 1, T = 1, lr 1e-3 (its defaults). docs/methods/flism.md
PRESETS["flism"] = {
    "selection": {"name": "random"},
    "aggregation": {"name": "flism"},
    "schedule": {"name": "joint"},
    "objective": {"name": "flism", "kd_weight": 1.0, "kd_temperature": 1.0},
    "training": {"upload": "all", "lr": 1e-3},
}

# RELIEF (Wu, Ding, Huang, IEEE IoT J. 2026, arXiv 2604.04243): the fusion layer's first weight
# split into one column block per sensor (model.fusion_blocks: sensor), each block averaged over
# the devices that hold its sensor and the rest over all senders (FedAvg with upload: held);
# every online device trains, Adam 1e-3, as TIDE's reproduction ran it. The paper's elastic
# per-device budgets are not implemented (docs/methods/relief.md says why)
PRESETS["relief"] = {
    "selection": {"name": "all_online"},
    "aggregation": {"name": "fedavg"},
    "schedule": {"name": "joint"},
    "objective": {"name": "ce"},
    "model": {"fusion_blocks": "sensor"},
    "training": {"upload": "held", "optimizer": "adam", "lr": 1e-3},
}

# BMSFed (Fan, Xu, Wang, Huo, Chen, Guo, ECCV 2024, arXiv 2401.00403): modal-enhancement loss
# on global per-sensor class prototypes (α = 2), each sensor's encoder averaged over the devices
# that trained it (upload: held), balanced submodular selection over the devices' last updates
# (τ = 1.5, candidate share 0.1) telling some multimodal devices to train the weak modality
# alone. docs/methods/bmsfed.md
PRESETS["bmsfed"] = {
    "selection": {"name": "bmsfed", "tau": 1.5, "subsample": 0.1},
    "aggregation": {"name": "bmsfed"},
    "schedule": {"name": "joint"},
    "objective": {"name": "bmsfed", "alpha": 2.0},
    "training": {"upload": "held"},
}

# M3Fed (Li, Qi, Zhang, Xu, "Cross-Modal Meta Consensus for Heterogeneous Federated Learning",
# ACM MM 2024, DOI 10.1145/3664647.3681510): Hessian-free Per-FedAvg meta steps (α = 1e-3,
# β = 1e-4, the released code's) with 0.6·MSE to the consensus projection G (model.consensus:
# one E×E map on every sensor's embedding); the server averages, clusters the updates by
# angular affinity (spectral, 4 clusters, one model per cluster) and merges G with
# inverse-distance weights; uniform random selection. docs/methods/m3fed.md
PRESETS["m3fed"] = {
    "selection": {"name": "random"},
    "aggregation": {"name": "m3fed", "clusters": 4},
    "schedule": {"name": "joint"},
    "objective": {"name": "m3fed", "alpha": 1e-3, "beta": 1e-4, "lambda_g": 0.6},
    "model": {"consensus": True},
    "training": {"upload": "all", "exchange": "delta", "sync_every": 1},
}

# FDARN (Yang, Xiong, Huang, Xu, AAAI 2022; the conference version of MCARN, TPAMI 2024,
# whose text was not found): a private network on each device (model.private: [branch]) beside
# the shared one, logits summed; CE + 0.6 orthogonality of the codes + 0.4 modality
# classification of the private code + 0.4 adversarial (gradient-reversed) modality
# classification of the shared code, both through ArcFace (s = 72, m = 0.5) on a discriminator
# of width 128 (model.discriminator), + 0.4 spread of the ArcFace class weights; FedAvg of the
# shared groups; every online device trains, SGD lr 0.01 momentum 0.9 (TIDE's reproduction of
# MCARN, FDARN's code). docs/methods/fdarn.md
PRESETS["fdarn"] = {
    "selection": {"name": "all_online"},
    "aggregation": {"name": "fedavg"},
    "schedule": {"name": "joint"},
    "objective": {"name": "fdarn"},
    "model": {"private": ["branch"], "discriminator": 128},
    "population": {"local_test_fraction": 0.2},
    "eval": {"scope": "devices"},
    "training": {"optimizer": "sgd", "lr": 0.01, "momentum": 0.9, "weight_decay": 1e-6},
}

#: the methods `raymm sweep --methods all` runs (named methods; ablations are left out)
METHODS.extend(["fedavg", "fedprox", "scaffold", "local", "tide", "fedmchain", "harmony",
                "fedproto", "fedadam", "fedyogi", "fedadagrad", "fedmultimodal",
                "fedmultimodal_opt", "gramfeddhar", "blossom", "blossom_ph", "blossom_phf",
                "flism", "relief", "bmsfed", "m3fed", "fdarn"])
