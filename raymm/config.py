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
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from raymm.errors import ScenarioError

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

    sensors: list[str] = Field(min_length=1)
    count: int | None = Field(default=None, ge=0)
    fraction: float | None = Field(default=None, ge=0, le=1)

    @model_validator(mode="after")
    def _one_size(self) -> TierSpec:
        if (self.count is None) == (self.fraction is None):
            raise ValueError("give exactly one of count or fraction")
        return self


class AvailabilitySpec(Strict):
    """A periodic availability pattern: online when (t + phase) mod period < online."""

    pattern: Literal["always", "business_hours", "overnight", "custom"] = "always"
    fraction: float = Field(default=1.0, ge=0, le=1)
    period: int | None = Field(default=None, ge=1)
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
    """A hardware profile; `jitter` spreads each device's speed by ±jitter (uniform)."""

    name: str = "default"
    fraction: float = Field(default=1.0, ge=0, le=1)
    gflops: float = Field(default=5.0, gt=0)
    up_mbps: float = Field(default=10.0, gt=0)
    down_mbps: float = Field(default=50.0, gt=0)
    jitter: float = Field(default=0.0, ge=0, lt=1)


class PartitionSpec(Strict):
    kind: Literal["dirichlet", "iid", "by_group"] = "dirichlet"
    alpha: float = Field(default=0.5, gt=0)
    min_samples: int = Field(default=2, ge=1)


class PopulationSpec(Strict):
    devices: int = Field(default=20, ge=1)
    tiers: list[TierSpec] | None = None
    availability: list[AvailabilitySpec] = Field(default_factory=lambda: [AvailabilitySpec()])
    hardware: list[HardwareSpec] = Field(default_factory=lambda: [HardwareSpec()])
    partition: PartitionSpec = PartitionSpec()
    #: split every device's samples into its own train/test part (e.g. 0.2 = 80/20), seeded;
    #: None keeps all of a device's samples for training (pooled evaluation only)
    local_test_fraction: float | None = Field(default=None, gt=0, lt=1)


class ModelSpec(Strict):
    """Per-sensor encoders, a fusion layer and a task head (see raymm.models)."""

    encoder: Literal["auto", "mlp", "cnn1d", "cnn2d"] = "auto"
    encoders: dict[str, Literal["mlp", "cnn1d", "cnn2d"]] = Field(default_factory=dict)
    embed_dim: int = Field(default=32, ge=1)
    hidden: int = Field(default=64, ge=1)
    fusion: Literal["concat", "sum_logits"] = "concat"
    fusion_dim: int = Field(default=64, ge=1)
    aux_heads: bool = False
    adapter: bool = False


class TrainingSpec(Strict):
    local_epochs: int = Field(default=1, ge=1)
    batch_size: int = Field(default=32, ge=1)
    lr: float = Field(default=0.05, gt=0)
    optimizer: Literal["sgd", "adam"] = "sgd"
    momentum: float = Field(default=0.0, ge=0, lt=1)
    weight_decay: float = Field(default=0.0, ge=0)
    #: what a selected device trains and uploads: every group (plain FedAvg on a multimodal
    #: model) or only the groups of the sensors it holds plus `shared` (pod-wise methods).
    upload: Literal["all", "held"] = "all"
    #: torch intra-op threads per training process; 1 keeps results bit-identical everywhere.
    threads: int = Field(default=1, ge=1)
    #: what a device keeps between rounds and exchanges with the server (see raymm.exchange):
    #: "params" downloads the server's vectors whenever selected and uploads trained vectors;
    #: "delta" keeps its own parameters, downloads at the first round of each sync window and
    #: uploads its change at sync rounds; "none" keeps its own parameters and never communicates.
    exchange: Literal["params", "delta", "none"] = "params"
    #: rounds per sync window (FedMChain's υ) when exchange is "delta"
    sync_every: int = Field(default=1, ge=1)


class PolicySpec(BaseModel):
    """`name` picks a registered policy; every other key is that policy's parameter."""

    model_config = ConfigDict(extra="allow", frozen=True)
    name: str

    def params(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class SelectionSpec(PolicySpec):
    name: str = "random"
    k: int = Field(default=10, ge=1)


class ActorSpec(Strict):
    num_cpus: float = Field(default=1.0, ge=0)
    num_gpus: float = Field(default=0.0, ge=0)
    resources: dict[str, float] = Field(default_factory=dict)
    max_restarts: int = Field(default=3, ge=0)


class ExecutionSpec(Strict):
    executor: Literal["serial", "ray"] = "ray"
    devices_per_actor: int | Literal["auto"] = "auto"
    actor: ActorSpec = ActorSpec()
    #: address of an existing cluster ("auto" reads RAY_ADDRESS); None starts a local Ray.
    address: str | None = None
    #: CPUs of the embedded local Ray (None: all of this machine's).
    local_num_cpus: int | None = Field(default=None, ge=1)


class EvalSpec(Strict):
    every: int = Field(default=1, ge=1)
    batch_size: int = Field(default=2048, ge=1)
    #: "pooled": the global model on the dataset's test split; "devices": every device on its
    #: own test part with the model it would use (needs population.local_test_fraction)
    scope: Literal["pooled", "devices"] = "pooled"


class OutputSpec(Strict):
    dir: str = "runs"
    tensorboard: bool = True
    checkpoint_every: int = Field(default=0, ge=0)


class Scenario(Strict):
    name: str = Field(min_length=1)
    seed: int = 0
    rounds: int = Field(ge=1)
    method: str | None = None
    description: str = ""
    dataset: dict[str, Any] = Field(default_factory=lambda: {"name": "synthetic"})
    population: PopulationSpec = PopulationSpec()
    model: ModelSpec = ModelSpec()
    training: TrainingSpec = TrainingSpec()
    selection: SelectionSpec = SelectionSpec()
    aggregation: PolicySpec = PolicySpec(name="fedavg")
    schedule: PolicySpec = PolicySpec(name="joint")
    objective: PolicySpec = PolicySpec(name="ce")
    execution: ExecutionSpec = ExecutionSpec()
    eval: EvalSpec = EvalSpec()
    output: OutputSpec = OutputSpec()

    @property
    def dataset_name(self) -> str:
        return str(self.dataset.get("name", ""))

    def dataset_params(self) -> dict[str, Any]:
        return {k: v for k, v in self.dataset.items() if k != "name"}

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


# --------------------------------------------------------------------------- loading


def read_yaml(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise ScenarioError([f"scenario file not found: {p}"])
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as exc:
        raise ScenarioError([f"not valid YAML: {exc}"], str(p)) from None
    except UnicodeDecodeError:
        raise ScenarioError(["not a text file"], str(p)) from None
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
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return parts, value


def apply_overrides(data: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Return a copy of `data` with each `key.path=value` set (the input is not mutated)."""
    out = copy.deepcopy(data)
    for item in overrides:
        parts, value = parse_override(item)
        node = out
        for p in parts[:-1]:
            nxt = node.get(p)
            if not isinstance(nxt, dict):
                nxt = {}
                node[p] = nxt
            node = nxt
        node[parts[-1]] = value
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


def parse_scenario(data: Mapping[str, Any], presets: Mapping[str, Mapping[str, Any]] | None = None,
                   source: str | None = None) -> Scenario:
    """Schema-check a raw mapping (after merging its preset under it). Raises ScenarioError."""
    raw = dict(data)
    method = raw.get("method")
    if method is not None and presets is not None:
        if not isinstance(method, str) or method not in presets:
            raise ScenarioError(
                [f"method: unknown preset {method!r}; choose one of: {', '.join(sorted(presets))}"],
                source)
        raw = deep_merge(presets[method], raw)
    try:
        return Scenario.model_validate(raw)
    except ValidationError as exc:
        raise ScenarioError(format_validation_error(exc), source) from None
