"""The scenario schema: typed, strict, validated as a whole before Ray starts.

A scenario is a YAML mapping. `method:` names a preset (a bundle of policy and model choices)
whose values the scenario's own keys override. Unknown keys, bad values and cross-field
mistakes (K > devices, a sensor the dataset lacks, d > D, a missing data file, an unknown policy)
are all collected and raised together as one `ScenarioError`.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from raymm.config.renamed import migrate, migrate_override, notice, set_path
from raymm.config.strict_yaml import load_yaml
from raymm.errors import ScenarioError
from raymm.io.paths import read_text

PATTERNS: dict[str, tuple[int, int]] = {
    # name: (period D, online rounds d per period)
    "always": (1, 1),
    "business_hours": (60, 40),
    "overnight": (40, 20),
}


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TierSpec(Strict):
    """Devices sharing one sensor set. Give `count` or `fraction` (of the population)."""

    #: sensors these devices hold (a subset of the dataset's sensors)
    sensors: list[str] = Field(min_length=1)
    #: number of devices in this tier
    count: int | None = Field(default=None, ge=0)
    #: share of the population in this tier (largest-remainder rounding)
    fraction: float | None = Field(default=None, ge=0, le=1)

    @model_validator(mode="after")
    def _one_size(self) -> TierSpec:
        if (self.count is None) == (self.fraction is None):
            raise ValueError("give exactly one of count or fraction")
        return self


class AvailabilitySpec(Strict):
    """A periodic availability pattern: online when (t + phase) mod period < online."""

    #: always; business_hours = 40 of every 60 rounds; overnight = 20 of every 40;
    #: custom = period/online
    pattern: Literal["always", "business_hours", "overnight", "custom"] = "always"
    #: share of devices following this pattern (assigned independently of sensors)
    fraction: float = Field(default=1.0, ge=0, le=1)
    #: D, the period in rounds (custom only)
    period: int | None = Field(default=None, ge=1)
    #: d, online rounds per period, d ≤ D (custom only)
    online: int | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _check(self) -> AvailabilitySpec:
        if self.pattern == "custom":
            if self.period is None or self.online is None:
                raise ValueError("a custom pattern needs period (D) and online (d)")
            if self.online > self.period:
                raise ValueError(f"online rounds d={self.online} exceed the period D={self.period}")
        elif self.period is not None or self.online is not None:
            raise ValueError(f"period/online are fixed for pattern {self.pattern!r}; use custom")
        return self

    def clock(self) -> tuple[int, int]:
        if self.pattern == "custom":
            assert self.period is not None and self.online is not None
            return self.period, self.online
        return PATTERNS[self.pattern]


class HardwareSpec(Strict):
    """A hardware profile; `jitter` spreads each device's speed and bandwidths by ±jitter
    (uniform, drawn per device)."""

    #: label shown in devices.parquet
    name: str = "default"
    #: share of devices with this profile
    fraction: float = Field(default=1.0, ge=0, le=1)
    #: compute speed; simulated training time = epochs × samples × FLOPs per sample / speed
    gflops: float = Field(default=5.0, gt=0)
    #: uplink bandwidth (Mbit/s)
    up_mbps: float = Field(default=10.0, gt=0)
    #: downlink bandwidth (Mbit/s)
    down_mbps: float = Field(default=50.0, gt=0)
    #: each device's speed and bandwidths vary by ±jitter around the profile
    jitter: float = Field(default=0.0, ge=0, lt=1)


class PartitionSpec(Strict):
    #: dirichlet label skew, iid, one device per data group (e.g. subject), or grouped: the
    #: devices split evenly over the data's G groups (device d in group ⌊d·G/N⌋, recorded in
    #: devices.parquet) and each group's samples split over its devices by the Dirichlet rule
    #: (alpha, min_samples), e.g. the synthetic data's label groups
    kind: Literal["dirichlet", "iid", "by_group", "grouped"] = "dirichlet"
    #: Dirichlet concentration (smaller = more skewed labels)
    alpha: float = Field(default=0.5, gt=0)
    #: devices below this are topped up from the largest devices
    min_samples: int = Field(default=2, ge=1)


# --- availability and the simulated clock (docs/time.md) ----------------------------------
class TraceSpec(Strict):
    """A device trace: availability intervals (and optionally speed and bandwidth) of real
    devices; the population's devices are mapped onto its entries, seeded, with replacement
    when there are more devices than entries. Replaces `availability` patterns."""

    #: raymm (CSV/Parquet table: device, start, end seconds; docs/time.md), flash (FLASH's
    #: device-state JSON) or fedscale (client_behave_trace pickle, read without pickle.load)
    format: Literal["raymm", "flash", "fedscale"] = "raymm"
    #: the trace file (relative paths resolve under $RAYMM_DATA, else the working directory)
    path: str = Field(min_length=1)
    #: fedscale only: the client_device_capacity pickle (speed and bandwidth per client)
    capacity: str | None = None
    #: take each device's speed and bandwidths from the trace where it gives them
    hardware: bool = True


class ClockSpec(Strict):
    """How simulated time drives the run. `rounds` (default) is the round-indexed clock: round
    t reads availability at slot t, and a round's seconds are only added up. `seconds`: one
    simulated clock; a round starts when the previous ended (later when nobody is available),
    selection sees who is available then, a device that leaves before its compute and traffic
    are done loses its update, and the round ends per `round_end`."""

    #: rounds (today's round-indexed availability) or seconds (one simulated clock)
    mode: Literal["rounds", "seconds"] = "rounds"
    #: all: the round waits for every participant (or faults.deadline_seconds); kth: it ends
    #: at the selection.k-th completion, of ceil(k·(1+overcommit)) selected
    round_end: Literal["all", "kth"] = "all"
    #: over-commitment o (round_end: kth): select ceil(k·(1+o)), keep the first k to finish
    overcommit: float = Field(default=0.0, ge=0, le=10)
    #: also evaluate each time the clock passes a multiple of this many simulated seconds
    eval_every_seconds: float | None = Field(default=None, gt=0)
    #: evaluation accuracy whose first simulated time summary.json reports
    target_accuracy: float | None = Field(default=None, gt=0, le=1)

    @model_validator(mode="after")
    def _check(self) -> ClockSpec:
        if self.overcommit and self.round_end != "kth":
            raise ValueError("overcommit needs round_end: kth (the first k completions kept)")
        if self.mode == "rounds" and (self.round_end != "all" or self.eval_every_seconds):
            raise ValueError("round_end: kth and eval_every_seconds need mode: seconds")
        return self


class PopulationSpec(Strict):
    #: number of simulated devices N
    devices: int = Field(default=20, ge=1)
    #: sensor tiers (default: one tier holding every sensor)
    tiers: list[TierSpec] | None = None
    #: availability patterns and their shares
    availability: list[AvailabilitySpec] = Field(default_factory=lambda: [AvailabilitySpec()])
    #: availability from a device trace instead of the patterns (docs/time.md)
    trace: TraceSpec | None = None
    #: simulated seconds per availability slot: round t of a pattern, or of the round clock
    #: reading a trace, is the instant (t-1)·slot_seconds
    slot_seconds: float = Field(default=60.0, gt=0)
    #: hardware profiles and their shares
    hardware: list[HardwareSpec] = Field(default_factory=lambda: [HardwareSpec()])
    #: how the training split is divided over devices
    partition: PartitionSpec = PartitionSpec()
    #: split every device's samples into its own train/test part (e.g. 0.2 = 80/20), seeded;
    #: None keeps all of a device's samples for training (pooled evaluation only)
    local_test_fraction: float | None = Field(default=None, gt=0, lt=1)


class ModelSpec(Strict):
    """The model: raymm's own network (per-sensor encoders, a fusion layer and a task head, see
    raymm.models) or one a registered factory builds (`factory`, `args`; docs/extending.md).
    The keys from `encoder` to `adapter` shape raymm's own network only; another factory
    decides its model's form itself (what a method needs of it is checked by validation)."""

    #: the registered model factory (raymm.models.factory): multimodal = raymm's own network,
    #: set by the keys below; a plugin's factory is given `args` and the data's shapes
    factory: str = "multimodal"
    #: keyword arguments of the factory (`ModelContext.args`); the built-in one takes none
    args: dict[str, Any] = Field(default_factory=dict)
    #: what happens to the model's floating-point buffers (batch norm's running mean and
    #: variance): average = they travel with their parameter group and are averaged like its
    #: parameters; local = every device keeps its own and they never travel (FedBN): a device
    #: trains and is evaluated with its own statistics, the global model keeps the initial
    #: ones. Integer buffers (batch norm's step count) start from their initial value for
    #: every device, so no number depends on how many devices a process trained before.
    buffers: Literal["average", "local"] = "average"

    #: encoder kind for every sensor; auto = MLP for vectors, 1D-CNN for [T, C], 2D-CNN for
    #: images; identity passes the flattened input on as the embedding (no parameters: with
    #: one sensor, fusion + head is the plain MLP of the standard benchmark workload);
    #: resnet18 = torchvision's ResNet-18 with GroupNorm, for [H, W] (one channel:
    #: spectrograms) or [C, H, W] inputs (11.2M parameters per sensor)
    encoder: Literal["auto", "mlp", "cnn1d", "cnn2d", "resnet18", "identity"] = "auto"
    #: per-sensor encoder kind, overriding `encoder`
    encoders: dict[str, Literal["mlp", "cnn1d", "cnn2d", "resnet18", "identity"]] = Field(
        default_factory=dict)
    #: embedding size of each sensor encoder
    embed_dim: int = Field(default=32, ge=1)
    #: hidden width of MLP encoders
    hidden: int = Field(default=64, ge=1)
    #: concat = fusion layer + task head (group `shared`); sum_logits = late fusion by
    #: summing per-sensor heads; attention = multi-head attention over the sensors'
    #: embeddings, absent sensors masked, then a layer to z + task head (group `shared`;
    #: every sensor's embedding of one size: FedMultimodal, docs/methods/fedmultimodal.md)
    fusion: Literal["concat", "sum_logits", "attention"] = "concat"
    #: size of the fused representation z
    fusion_dim: int = Field(default=64, ge=1)
    #: none = the fusion layer's first weight travels whole in `shared`; sensor = its column
    #: block W^(m) (the columns that multiply sensor m's embedding) travels in `sensor:<m>`,
    #: the bias stays in `shared` (RELIEF's per-sensor blocks, docs/methods/relief.md; same
    #: outputs and initial weights). Only concat fusion has that layer: elsewhere no effect
    fusion_blocks: Literal["none", "sensor"] = "none"
    #: attention fusion's heads (FedMultimodal's d_head)
    attention_heads: int = Field(default=6, ge=1)
    #: width of attention fusion's scoring layer tanh(W1 e + b1)
    attention_hidden: int = Field(default=512, ge=1)
    #: give each sensor its own classification head (in its group)
    aux_heads: bool = False
    #: a device-local residual adapter on z that never leaves the device
    adapter: bool = False
    #: the adapter's bottleneck width as a share of fusion_dim (at least 1 unit): 0.5, what
    #: the committed TIDE tables ran with; TIDE's design asks for at most 0.25
    adapter_bottleneck: float = Field(default=0.5, gt=0, le=1)
    #: blocks every device keeps as its own and never exchanges (BLOSSOM's private head
    #: and fusion, docs/methods/blossom.md): head = the task head (with fusion: sum_logits,
    #: every sensor's head), fusion = the fusion layer (none under sum_logits). They form the
    #: group `private`, trained with the device's other groups, kept in its state and
    #: checkpoints, used for its training and its evaluation (eval.scope: devices: there is
    #: no global head), never downloaded or uploaded; a device starts from the initial values.
    #: branch = a second, private network beside the shared one (its own encoders, fusion and
    #: head, or per-sensor heads under sum_logits) whose logits are added to the shared
    #: ones: FDARN's egocentric encoder and private classifier (docs/methods/fdarn.md)
    private: list[Literal["head", "fusion", "branch"]] = Field(default_factory=list)
    #: width of a modality discriminator on the shared and private codes (0 = none): a
    #: Linear(code, width) + ReLU and the ArcFace class weights of the 2^M - 1 sensor sets,
    #: in `shared`; read by the fdarn objective only (docs/methods/fdarn.md)
    discriminator: int = Field(default=0, ge=0)
    #: M3Fed's consensus projection G: one square linear map (no bias, starting as the
    #: identity) applied to every sensor's embedding before fusion or the sensors' heads, the
    #: last E×E numbers of `shared` (docs/methods/m3fed.md); every embedding must have the
    #: same width (no identity encoders)
    consensus: bool = False


#: the model keys only attention fusion reads (left out of `Scenario.to_dict` otherwise)
ATTENTION_KEYS = ("attention_heads", "attention_hidden")


class TrainingSpec(Strict):
    #: local epochs per selected device per round
    local_epochs: int = Field(default=1, ge=1)
    #: local minibatch size
    batch_size: int = Field(default=32, ge=1)
    #: local learning rate
    lr: float = Field(default=0.05, gt=0)
    #: local optimizer (fresh each round)
    optimizer: Literal["sgd", "adam"] = "sgd"
    #: SGD momentum
    momentum: float = Field(default=0.0, ge=0, lt=1)
    #: L2 weight decay
    weight_decay: float = Field(default=0.0, ge=0)
    #: what a selected device trains and uploads: every group (plain FedAvg on a multimodal
    #: model) or only the groups of the sensors it holds plus `shared` (pod-wise methods).
    upload: Literal["all", "held"] = "all"
    #: what a device keeps between rounds and exchanges with the server (see
    #: raymm.protocol.exchange): "params" downloads the server's vectors whenever selected and
    #: uploads trained vectors; "delta" keeps its own parameters, downloads at the first round of
    #: each sync window and uploads its change at sync rounds; "none" keeps its own parameters and
    #: never communicates; "personal" keeps its own parameters and exchanges only extras (e.g.
    #: FedProto's prototypes), on the sync windows of "delta".
    exchange: Literal["params", "delta", "none", "personal"] = "params"
    #: rounds per sync window (FedMChain's υ) when exchange is "delta" or "personal"
    sync_every: int = Field(default=1, ge=1)


class PolicySpec(BaseModel):
    """`name` picks a registered policy; every other key is that policy's parameter."""

    model_config = ConfigDict(extra="allow", frozen=True)
    name: str

    def params(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class SelectionSpec(PolicySpec):
    #: selection policy (see Policies below)
    name: str = "random"
    #: K, devices selected per round (at most)
    k: int = Field(default=10, ge=1)


class ActorSpec(Strict):
    #: CPUs each DeviceActor asks Ray for (fractions allowed)
    num_cpus: float = Field(default=1.0, ge=0)
    #: GPUs each DeviceActor asks for; 0.1 packs ten actors per GPU
    num_gpus: float = Field(default=0.0, ge=0)
    #: custom Ray resources each DeviceActor asks for
    resources: dict[str, float] = Field(default_factory=dict)
    #: times Ray restarts a DeviceActor that died
    max_restarts: int = Field(default=3, ge=0)
    #: memory each DeviceActor asks Ray for: auto = estimated from what it will hold (its
    #: devices' model copies, kept states and data rows, plus a measured base:
    #: raymm.device.footprint), a number = that many MiB, 0 = none
    memory: float | Literal["auto"] = Field(default="auto")

    @field_validator("memory")
    @classmethod
    def _memory_not_negative(cls, v: float | str) -> float | str:
        if not isinstance(v, str) and v < 0:
            raise ValueError("memory: MiB per DeviceActor, 0 or more (or auto)")
        return v


class EngineSpec(Strict):
    """How a host's devices train: speed switches, not learning semantics. Results do not
    depend on them beyond float32 rounding (`path`, `closed_form`) or at all (`chunk`);
    `threads` above 1 lets a CPU's reductions split, so its bits may depend on the machine."""

    #: lockstep = a host's selected devices train together under torch.func
    #: (raymm.training.lockstep), the fast path; sequential = one after another (the reference
    #: path: the same numbers to float32 rounding). Where lock-step does not apply (an objective
    #: that does not opt in, a model with buffers) the run says so once and trains sequentially
    path: Literal["lockstep", "sequential"] = "lockstep"
    #: at most this many devices per lock-step program (bounds memory; results do not depend
    #: on it)
    chunk: int = Field(default=1024, ge=1)
    #: in lock-step, take the gradient of a model and loss raymm knows by hand-written batched
    #: products rather than through autograd (raymm.protocol.fast_paths, by objective: an MLP
    #: under cross-entropy; TIDE's loss after the encoders): the same numbers to float32
    #: rounding, faster steps; false: autograd everywhere
    closed_form: bool = True
    #: torch intra-op threads per training process; with one thread a CPU run gives the same
    #: numbers on every executor and packing (README: "Same seed, same numbers")
    threads: int = Field(default=1, ge=1)

    @property
    def lockstep(self) -> bool:
        return self.path == "lockstep"


class ExecutionSpec(Strict):
    #: serial (in-process reference) or ray
    executor: Literal["serial", "ray"] = "ray"
    #: devices hosted by each DeviceActor; auto = as many actors as the cluster fits
    devices_per_actor: int | Literal["auto"] = "auto"
    #: resources of each DeviceActor
    actor: ActorSpec = ActorSpec()
    #: address of an existing cluster ("auto" reads RAY_ADDRESS); None starts a local Ray.
    address: str | None = None
    #: CPUs of the embedded local Ray (None: all of this machine's).
    local_num_cpus: int | None = Field(default=None, ge=1)
    #: how devices train: the training engine's speed switches
    training: EngineSpec = EngineSpec()
    #: the torch device a host trains on: auto = a GPU when there is one (the serial executor:
    #: when torch sees CUDA; a DeviceActor: when Ray gave it a GPU that torch can use), cpu =
    #: always the CPU, cuda = a GPU or a clear error (DeviceActors then need `actor.num_gpus`
    #: > 0)
    accelerator: Literal["auto", "cpu", "cuda"] = "auto"
    #: Ray: the server plans round t+1 as soon as it has aggregated round t, while the round's
    #: statistics travel to the driver (one Ray round trip less per round); never after an
    #: evaluation or a checkpoint round, which the next plan may depend on. Same numbers
    #: either way
    plan_ahead: bool = True
    #: a cluster whose autoscaler can add nodes (cluster.yaml's worker types below their
    #: max_workers): a packing that does not fit now asks it for the DeviceActors' resources
    #: and waits up to autoscale_timeout_s; off = fail at once with the numbers
    autoscale: Literal["auto", "off"] = "auto"
    #: seconds to wait for the autoscaler's nodes
    autoscale_timeout_s: float = Field(default=900, gt=0)
    #: Ray: where the server runs: "actor", a ServerActor on the driver's node, or "driver",
    #: in the driver's process (actors.driver_server): one process with torch fewer (~0.3 GiB,
    #: more with a CUDA build) for a machine short of memory; the driver then waits while the
    #: server works. Same numbers either way
    server: Literal["actor", "driver"] = "actor"


class EvalSpec(Strict):
    #: evaluate every N rounds (and after the last round)
    every: int = Field(default=1, ge=1)
    #: evaluation batch size
    batch_size: int = Field(default=2048, ge=1)
    #: communication budget B in GiB for Acc@B and Acc@B/2 (None: not reported)
    budget_gib: float | None = Field(default=None, gt=0)
    #: stop after this many evaluations without a new best accuracy (None: never)
    early_stop_patience: int | None = Field(default=None, ge=1)
    #: "pooled": the global model on the dataset's test split; "devices": every device on its
    #: own test part with the model it would use (needs population.local_test_fraction);
    #: "both": the pooled metrics (accuracy, early stopping, Acc@B stay global) and, next to
    #: them, the per-device ones as personal_* (a device predicts with its own adapter)
    scope: Literal["pooled", "devices", "both"] = "pooled"


class OutputSpec(Strict):
    #: parent folder of run directories
    dir: str = "runs"
    #: write TensorBoard events and pictures
    tensorboard: bool = True
    #: write a checkpoint every N rounds (0: only on Ctrl-C); `raymm run --resume DIR` continues
    checkpoint_every: int = Field(default=0, ge=0)
    #: how many newest checkpoints to keep
    keep_checkpoints: int = Field(default=2, ge=1)


class FaultSpec(Strict):
    """Deterministic fault injection; every decision is drawn from (seed, round, unit)."""

    #: stream seed of the faults (None: the scenario's seed)
    seed: int | None = Field(default=None, ge=0)
    #: per round and DeviceActor (per host on the serial executor): the actor dies mid-round
    actor_kill_prob: float = Field(default=0.0, ge=0, le=1)
    #: per selected device: it crashes before returning its update
    device_crash_prob: float = Field(default=0.0, ge=0, le=1)
    #: simulated-time round deadline in seconds; slower devices are dropped as stragglers
    deadline_seconds: float | None = Field(default=None, gt=0)

    @property
    def active(self) -> bool:
        return bool(self.actor_kill_prob or self.device_crash_prob or self.deadline_seconds)


class PrivacySpec(Strict):
    """User-level differential privacy of the uploads (docs/methods/privacy.md): each device's
    update is clipped on the device; `central` adds Gaussian noise to the sum on the server,
    `local` on each device before it leaves. Off by default, and then nothing changes."""

    #: `off`, `central` (trusted server: noise once per round on the sum) or `local` (each
    #: device noises its own clipped update)
    mode: Literal["off", "central", "local"] = "off"
    #: σ, the noise multiplier: the noise's standard deviation is σ·C (None: solved from
    #: `target_epsilon` before the run)
    noise_multiplier: float | None = Field(default=None, ge=0)
    #: C, the L2 bound of one device's whole update (the starting value with `adaptive_clip`);
    #: null is C = ∞ (nothing clipped), allowed only with σ = 0
    clip: float | None = Field(default=1.0, gt=0)
    #: `update`: one norm over every group a device sends; `group`: group g is clipped to
    #: C·sqrt(s_g), the shares s_g summing to one over the model's travelling groups
    clip_unit: Literal["update", "group"] = "update"
    #: how `clip_unit: group` splits C² between groups: by parameter count or equally
    group_split: Literal["size", "equal"] = "size"
    #: the fixed number of contributions the noised sum is divided by (None: min(k, devices),
    #: times the share of devices able to send the group); never the realised count
    denominator: float | None = Field(default=None, gt=0)
    #: δ of the reported (ε, δ) (None: min(1 / devices², 1e-5), `default_delta`)
    delta: float | None = Field(default=None, gt=0, lt=1)
    #: a budget: with `on_target: stop` the run ends before a release would pass it; with
    #: `calibrate` σ is solved before the run so that the whole run spends exactly it
    target_epsilon: float | None = Field(default=None, gt=0)
    #: what `target_epsilon` does: `stop` the run, or `calibrate` σ
    on_target: Literal["stop", "calibrate"] = "stop"
    #: `rdp` (Rényi DP) or `pld` (privacy-loss distributions), both from Google's dp-accounting
    accountant: Literal["rdp", "pld"] = "rdp"
    #: cap on the releases any one device takes part in (selection skips devices at the cap);
    #: the accountant then composes at most this many per device
    max_participation: int | None = Field(default=None, ge=1)
    #: a per-device budget: a device is not selected again once one more release would take
    #: its ε past this (a cap on its participations, solved before the run)
    device_budget: float | None = Field(default=None, gt=0)
    #: how a uniform selector (`random`, `fraction`) draws the cohort under privacy: `fixed`,
    #: exactly its K of the eligible; `poisson`, every eligible device independently with
    #: probability q = E / N (E the expected cohort, N the devices), which is what
    #: amplification by sampling is accounted for
    sampling: Literal["fixed", "poisson"] = "fixed"
    #: the seed of the selection's draws, kept out of config.yaml and the run's tables (the
    #: trusted server's secret; the checkpoint keeps it for a resume); without it the selection
    #: is replayable from the published seed and nothing is amplified. Also read from the
    #: environment variable RAYMM_SELECTION_SECRET
    selection_secret: int | None = Field(default=None, ge=0, exclude=True, repr=False)
    #: adaptive clipping (Andrew et al., 2021): C follows the `target_quantile` of the update
    #: norms, estimated from a noised count of unclipped updates (central mode only)
    adaptive_clip: bool = False
    #: γ: the share of updates that should stay unclipped
    target_quantile: float = Field(default=0.5, gt=0, lt=1)
    #: η: C ← C·exp(−η·(b̄ − γ)) after each release
    clip_lr: float = Field(default=0.2, gt=0)
    #: σ_b, standard deviation of the noise on the count of unclipped updates (None: the
    #: denominator / 20, and at least σ); σ_b must exceed σ/2
    count_noise: float | None = Field(default=None, gt=0)

    @property
    def on(self) -> bool:
        return self.mode != "off"

    @model_validator(mode="after")
    def _consistent(self) -> PrivacySpec:
        if self.clip is None and (self.noise_multiplier or self.target_epsilon is not None
                                  or self.adaptive_clip):
            raise ValueError("privacy.clip: null (no clipping) needs noise_multiplier: 0, no "
                             "target_epsilon and no adaptive_clip: noise is σ·C")
        if self.mode != "off" and self.noise_multiplier is None and not (
                self.target_epsilon is not None and self.on_target == "calibrate"):
            raise ValueError("privacy: give noise_multiplier, or target_epsilon with "
                             "on_target: calibrate")
        if self.noise_multiplier is not None and self.target_epsilon is not None \
                and self.on_target == "calibrate":
            raise ValueError("privacy: on_target: calibrate solves noise_multiplier; do not "
                             "give both")
        if self.adaptive_clip and self.count_noise is not None and \
                self.noise_multiplier is not None and \
                self.noise_multiplier >= 2 * self.count_noise:
            raise ValueError("privacy.adaptive_clip: count_noise must exceed noise_multiplier / 2 "
                             "(the update's own noise is (σ⁻² − (2σ_b)⁻²)^-½)")
        if self.adaptive_clip and self.mode != "central":
            raise ValueError("privacy.adaptive_clip needs mode: central: its bit (whether a "
                             "device's update was within C) is noised once, on the server, "
                             "which local DP does not trust")
        if self.device_budget is not None and self.mode != "off" and self.clip is None:
            raise ValueError("privacy.device_budget needs a clip bound (privacy.clip)")
        return self


class Scenario(Strict):
    """A whole simulation: data, devices, model, policies, execution and output."""

    #: run name (the run directory is <name>-<timestamp>)
    name: str = Field(min_length=1)
    #: every random draw derives from it
    seed: int = Field(default=0, ge=0)
    #: number of rounds
    rounds: int = Field(ge=1)
    #: a preset name (fedavg, fedprox, …) whose values this scenario overrides
    method: str | None = None
    #: free text
    description: str = ""
    #: `name` of a registered dataset plus its parameters (see docs/data.md)
    dataset: dict[str, Any] = Field(default_factory=lambda: {"name": "synthetic"})
    #: the simulated devices
    population: PopulationSpec = PopulationSpec()
    #: the multimodal model
    model: ModelSpec = ModelSpec()
    #: local training
    training: TrainingSpec = TrainingSpec()
    #: who trains each round
    selection: SelectionSpec = SelectionSpec()
    #: how updates combine
    aggregation: PolicySpec = PolicySpec(name="fedavg")
    #: which parameter groups are active each round
    schedule: PolicySpec = PolicySpec(name="joint")
    #: the local loss
    objective: PolicySpec = PolicySpec(name="ce")
    #: where devices run
    execution: ExecutionSpec = ExecutionSpec()
    #: evaluation
    eval: EvalSpec = EvalSpec()
    #: run directory and checkpoints
    output: OutputSpec = OutputSpec()
    #: deterministic fault injection
    faults: FaultSpec = FaultSpec()
    #: differential privacy of the uploads (off by default)
    privacy: PrivacySpec = PrivacySpec()
    #: the simulated clock: round-indexed (default) or seconds (docs/time.md)
    clock: ClockSpec = ClockSpec()

    @property
    def dataset_name(self) -> str:
        return str(self.dataset.get("name", ""))

    def dataset_params(self) -> dict[str, Any]:
        return {k: v for k, v in self.dataset.items() if k != "name"}

    def to_dict(self) -> dict[str, Any]:
        out = self.model_dump(mode="json")
        if self.privacy == PrivacySpec():  # unchanged files (and checkpoint digests) when off
            del out["privacy"]
        if self.clock == ClockSpec():  # the same for the clock and trace keys at their defaults
            del out["clock"]
        pop = out["population"]
        if pop.get("trace") is None and pop.get("slot_seconds") == 60.0:
            del pop["trace"], pop["slot_seconds"]
        model, unset = out["model"], ModelSpec()
        if model["fusion"] != "attention" and all(   # and attention fusion's, unused
                model[k] == getattr(unset, k) for k in ATTENTION_KEYS):
            for k in ATTENTION_KEYS:
                del model[k]
        if not model["private"]:  # unchanged files when no block is kept on the devices
            del model["private"]
        if model["fusion_blocks"] == "none":   # the same for the fusion layer's blocks
            del model["fusion_blocks"]
        if not model["consensus"]:   # the same without M3Fed's consensus projection
            del model["consensus"]
        if not model["discriminator"]:   # the same without FDARN's modality discriminator
            del model["discriminator"]
        return out


# --------------------------------------------------------------------------- loading


def read_yaml(path: str | Path) -> dict[str, Any]:
    """A scenario file: a regular, small, UTF-8 file of strict YAML (see raymm.config.limits)."""

    p = Path(path)
    try:
        data = load_yaml(read_text(p, "scenario file"))
    except yaml.YAMLError as exc:
        raise ScenarioError([f"not valid YAML: {exc}"], str(p)) from None
    except ValueError as exc:
        raise ScenarioError([str(exc)], str(p)) from None
    if not isinstance(data, dict):
        raise ScenarioError([f"the top level must be a mapping, got {type(data).__name__}"], str(p))
    return data


def parse_override(item: str) -> tuple[list[str], Any]:
    """`a.b.c=value` -> (["a","b","c"], value parsed as YAML)."""
    if "=" not in item:
        raise ScenarioError([f"--set {item!r}: expected key.path=value"])
    key, _, raw = item.partition("=")
    parts = [p for p in key.strip().split(".") if p]
    if not parts:
        raise ScenarioError([f"--set {item!r}: empty key"])

    try:
        value = load_yaml(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    except ValueError as exc:
        raise ScenarioError([f"--set {key.strip()}: {exc}"]) from None
    return parts, value


def apply_overrides(data: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Return a copy of `data` with each `key.path=value` set (the input is not mutated). Keys
    under an old name (raymm.config.renamed), in the file or on the command line, are moved to
    their new name first, so an old `--set` key overrides the file's new one."""
    out, renames, _ = migrate(data)  # a key given twice is check_scenario's to report
    for item in overrides:
        parts, value = parse_override(item)
        parts, value, rename = migrate_override(parts, value)
        renames += [rename] if rename else []
        set_path(out, parts, value)
    notice(renames)
    return out


def deep_merge(base: Mapping[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    """Mappings merge key by key; anything else in `top` replaces `base`."""
    out = copy.deepcopy(dict(base))
    for k, v in top.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), Mapping):
            # a policy section that names another policy starts from scratch, so a preset's
            # parameters for its own policy do not leak into a different one
            if "name" in v and v.get("name") != out[k].get("name"):
                out[k] = copy.deepcopy(dict(v))
            else:
                out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def _loc(err: Mapping[str, Any]) -> str:
    return ".".join(str(p) for p in err["loc"]) or "(top level)"


def format_validation_error(exc: ValidationError) -> list[str]:
    problems = []
    for err in exc.errors():
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown key"
        elif err["type"] == "missing":
            msg = "required key is missing"
        elif err["type"] == "literal_error":
            msg = f"{msg} (got {err.get('input')!r})"
        problems.append(f"{_loc(err)}: {msg}")
    return problems
