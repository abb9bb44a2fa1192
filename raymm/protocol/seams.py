"""The seams every method plugs into: Selector, Aggregator, Schedule, Objective.

Each seam is a base class that holds its whole contract: the methods a policy must write, and
every optional hook with a safe default and a docstring saying when the core calls it and what
it may do. Implementations live in the `policies` package (one small class per file,
registered by name in `raymm.protocol.registry`, which accepts only subclasses of the seam); the
core calls the hooks directly, never looking them up by name.

Every policy (`Policy`) may also have `check_scenario(params, scenario, sensors)` (a
staticmethod: rules that involve the rest of the scenario, reported by `raymm validate`) and
`bind(scenario, sensors)` (run-level facts, read when the run is built; whatever it refuses
must be in `check_scenario`, as tests/unit/app/test_validate.py checks for every registered
policy). docs/adding-a-policy.md lists every hook.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict
from torch import Tensor

from raymm.config.schema import Scenario
from raymm.models.layout import GroupLayout
from raymm.models.network import ModelOutput, RaymmNet
from raymm.protocol.messages import ClusterModels, UpdateBatch
from raymm.protocol.observations import Observations


@dataclass(frozen=True)
class SelectionContext:
    round: int
    online: np.ndarray        # sorted ids of the devices that reported online
    eligible: np.ndarray      # sorted subset of `online` the schedule lets take part
    k: int
    obs: Observations
    rng: np.random.Generator  # stream (seed, round, server, "selection")
    #: what the aggregator publishes for selection (`Aggregator.selection_view`), read-only:
    #: per-device statistics only the aggregator sees (e.g. BMSFed's update distances)
    published: Mapping[str, np.ndarray] = field(default_factory=dict)


@dataclass(frozen=True)
class EvalFeedback:
    """The headline accuracy of an evaluation (the pooled one, or the per-device mean with
    `eval.scope: devices`) and the run's totals at that round: what a policy that learns from
    outcomes (TIDE's adaptive weights) is shown."""

    round: int
    accuracy: float
    bytes_total: int
    sim_seconds: float


@dataclass(frozen=True)
class ModalityReport:
    """Per-modality accuracies that a round's participants report on their own training
    samples, before training, with the server's vectors (asked for by a schedule's
    `report_sensors`; see `raymm.device.evaluation.unimodal_correct`).

    `correct[i, j]`: device i's correct predictions with only sensor j present, -1 where it was
    not asked or does not hold j; `num_samples[i]`: the samples it evaluated.
    """

    round: int
    device_ids: np.ndarray   # int64 [n], sorted
    num_samples: np.ndarray  # int64 [n]
    correct: np.ndarray      # int32 [n, M]

    def accuracy(self) -> np.ndarray:
        """float [M]: Σ correct / Σ samples over the devices that reported each sensor (every
        sample weighs the same); NaN where nobody did."""
        has = self.correct >= 0
        n = (has * self.num_samples[:, None]).sum(axis=0).astype(np.float64)
        hits = np.where(has, self.correct, 0).sum(axis=0).astype(np.float64)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(n > 0, hits / np.maximum(n, 1), np.nan)


class NoParams(BaseModel):
    """The parameters of a policy that takes none."""

    model_config = ConfigDict(extra="forbid")


class Policy:
    """What every policy has besides its seam's own methods: its parameter model and two hooks
    for rules that involve the rest of the run, each with a safe default."""

    #: the pydantic model of the policy's scenario section (its `name` aside); the registry
    #: checks a scenario against it and builds the policy as `cls(Params(...))`
    Params: ClassVar[type[BaseModel]] = NoParams

    @staticmethod
    def check_scenario(params: Any, scenario: Scenario, sensors: tuple[str, ...] | None
                       ) -> list[str]:
        """Every problem of `params` against the validated scenario and the dataset's sensors
        (None when the dataset section is itself invalid, which is reported already).

        Called by `raymm validate` (and so before `raymm run` loads data or starts Ray), on the
        class, with every other check. Default: no problems."""
        return []

    @staticmethod
    def model_needs(params: Any) -> frozenset[str]:
        """What this policy needs of the model, as names of `raymm.models.factory.ModelFacts`
        fields (sensor_groups, sensor_heads, logit_fusion, fused, adapter). `raymm validate`
        builds the scenario's model (on torch's meta device) and refuses one that lacks any,
        naming the part and this policy. Default: nothing (any model, a whole one included)."""
        return frozenset()

    def bind(self, scenario: Scenario, sensors: tuple[str, ...]) -> None:
        """Read run-level facts (the rounds, the dataset's sensors) once, when the run is built
        (`raymm.app.build.build_policies`; also at the end of a run, on a fresh aggregator asked for
        its cluster models for the model file). May refuse only what `check_scenario` reports,
        raised with `raymm.errors.refuse`. Default: nothing to read."""
        return None

    def overrides(self, hook: Callable[..., object]) -> bool:
        """Whether this policy's class replaces the base class's default `hook` (given as e.g.
        `Objective.device_finish`): the core skips work whose only use is a hook left at its
        default (copying the start vectors for `device_finish`, say)."""
        return getattr(type(self), hook.__name__) is not hook


class ServerPolicy(Policy):
    """Hooks of the policies that live in the server (selector, schedule, aggregator)."""

    def round_stats(self) -> dict[str, float]:
        """Columns this policy adds to the round's row (e.g. the selection weights used), asked
        for after aggregation every round (the aggregator's only when updates arrived).
        Default: none."""
        return {}

    def observe_evaluation(self, fb: EvalFeedback) -> None:
        """Shown the headline accuracy, traffic and simulated time of every evaluation (the
        pooled one, or the per-device mean with `eval.scope: devices`). May update what the
        policy has learned (which is then state: see `state_dict`). Default: ignores it."""
        return None

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint must keep of this policy (arrays and JSON values). Called at every
        checkpoint; a resumed run passes it back to `load_state_dict`. Default: nothing."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` returned (on resume, before the first round)."""
        return None


class Selector(ServerPolicy, ABC):
    """Who trains: return at most k sorted device ids from `ctx.eligible`.

    `select` is called once a round in the server, after the schedule's `eligible`. The other
    hooks are `ServerPolicy`'s (`round_stats`, `observe_evaluation`, `state_dict`,
    `load_state_dict`) and `Policy`'s (`check_scenario`, `bind`), each with a default.
    """

    #: `select` returns every eligible device, however many (`all_online`): `ctx.k` does not
    #: bound it, the server checks the ids against the eligible ones only
    every_eligible: ClassVar[bool] = False

    @abstractmethod
    def select(self, ctx: SelectionContext) -> np.ndarray:
        """At most `ctx.k` sorted ids from `ctx.eligible` (the server checks this); randomness
        only from `ctx.rng`."""

    def train_sensors(self, selected: np.ndarray) -> np.ndarray | None:
        """bool [len(selected), M]: the sensors each device `select` just returned (sorted, as
        returned) trains with this round, among those it holds (a per-device instruction: it
        trains, sends and downloads only those sensors' groups, and sees the others as absent).
        Asked right after `select`, in the same round. Default: None, every device trains with
        every sensor it holds."""
        return None


@dataclass(frozen=True)
class AggregationContext:
    round: int
    sensors: tuple[str, ...]
    obs: Observations
    seed: int


class Aggregator(ServerPolicy, ABC):
    """How updates combine. Owns its server state (e.g. prototypes, cluster models).

    `aggregate` is the one method every aggregator writes; every other hook has a default.
    Three class attributes say what it merges (each False unless declared):

    - `combinable`: the new vectors depend on the updates only through
      `UpdateBatch.weighted_mean` with sample-count weights, so hosts may send whole id blocks
      pre-summed (`raymm.protocol.combine`); without it every sender's row arrives in
      `batch.updates`. The claim belongs to the reduce: a class that defines `aggregate` or
      `weights` itself and does not state `combinable` itself is not combinable
      (`__init_subclass__`), so a subclass that changes the weights cannot inherit the claim by
      accident. It may be set per instance in `__init__` when it depends on the parameters
      (TIDE's `weighting`).
    - `takes_deltas`: uploads are deltas (`training.exchange: delta`).
    - `personal`: no parameters travel, only extras (`training.exchange: personal`, FedProto).
    """

    combinable: bool = False
    takes_deltas: bool = False
    personal: bool = False

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        # `combinable` is a claim about the reduce: a class that writes its own `aggregate` or
        # `weights` makes the claim again, or it does not hold
        defines_reduce = "aggregate" in cls.__dict__ or "weights" in cls.__dict__
        if defines_reduce and "combinable" not in cls.__dict__:
            cls.combinable = False

    @abstractmethod
    def aggregate(self, params: dict[str, np.ndarray], batch: UpdateBatch,
                  ctx: AggregationContext) -> dict[str, np.ndarray]:
        """Return the new global vector of every group (unchanged groups may be returned as is).
        Called in the server once a round when any update arrived, with the batch merged over
        all hosts and sorted by device id. Must not mutate `params` or `batch`."""

    def extras(self, round: int) -> dict[str, np.ndarray]:
        """Extra payload broadcast with the model this round (e.g. prototypes, control
        variates), counted as downlink. Called when the round is planned. Default: none."""
        return {}

    def selection_view(self) -> dict[str, np.ndarray]:
        """Per-device statistics this aggregator publishes to the selector (e.g. distances
        between the devices' last updates), handed to `select` as `SelectionContext.published`
        (read-only). Called when the round is planned, before selection. Default: none."""
        return {}

    def cluster_models(self) -> ClusterModels | None:
        """Per-device alternative models (SSCA's clusters, Harmony's modality models), put in
        every broadcast (training and per-device evaluation) and in `device_models.safetensors`.
        Default: None (every device gets the global vectors)."""
        return None

    def eval_extras(self) -> dict[str, np.ndarray]:
        """Extras a per-device evaluation needs (`eval.scope: devices`, e.g. prototypes).
        Default: none."""
        return {}

    def extras_uplink_bytes(self, batch: UpdateBatch) -> np.ndarray:
        """int64 [batch.n]: the bytes each returning device's extras carried, called when the
        round's traffic is counted. Default: the full size of one device's every extra; an
        aggregator that knows which parts carry something (FedProto: the classes a device
        holds) counts them itself."""
        per_device = sum(int(v[0].nbytes) for v in batch.extras.values()) if batch.n else 0
        return np.full(batch.n, per_device, np.int64)


class Schedule(ServerPolicy, ABC):
    """Which parameter groups are active in a round, and which devices may take part.

    `active_groups`, `eligible` and `phase` are the methods every schedule writes; the hooks
    below (and `ServerPolicy`'s, `Policy`'s) have defaults that describe a one-phase schedule
    which decides nothing as it goes.
    """

    #: first round whose evaluations count toward early stopping (a staged method's last
    #: stage); read once when the run loop starts, after `bind`
    final_stage_start: int = 1

    @abstractmethod
    def active_groups(self, round: int, groups: list[str]) -> tuple[str, ...]:
        """The groups trained in `round` (called when the round is planned)."""

    @abstractmethod
    def eligible(self, round: int, sensor_mask: np.ndarray,
                 sensors: tuple[str, ...]) -> np.ndarray:
        """bool per row of `sensor_mask` (the online devices): may take part in `round`."""

    @abstractmethod
    def phase(self, round: int) -> str:
        """The phase's name, a column of the round's row."""

    def phase_span(self, round: int) -> tuple[int, int] | None:
        """(first, last) round of `round`'s phase: periodic sync windows restart at each phase
        (`raymm.protocol.exchange.sync_window`). Default: None, one phase that is the whole run."""
        return None

    def frozen_groups(self, round: int) -> tuple[str, ...]:
        """Groups read but not trained in `round` (a chain's earlier modalities), sent to each
        device once and counted as downlink. Default: none."""
        return ()

    def begin_round(self, round: int, obs: Observations) -> None:
        """Called first when a round is planned, before `eligible`: a schedule that decides as
        it goes (the adaptive chain) decides here. Default: nothing."""
        return None

    def report_sensors(self, round: int) -> tuple[str, ...]:
        """Sensors whose unimodal accuracy the round's participants report before training
        (counted as uplink; handed to `observe`). Default: none."""
        return ()

    def observe(self, report: ModalityReport) -> None:
        """The participants' unimodal accuracies, after aggregation in a round whose
        `report_sensors` was not empty. Default: ignores them."""
        return None

    def extras(self, round: int) -> dict[str, np.ndarray]:
        """Payload broadcast with the model (counted as downlink), besides the aggregator's.
        Default: none."""
        return {}


#: (parameters replacing the current ones, inputs per sensor, presence mask [B, M]) -> output
ForwardFn = Callable[[Mapping[str, Tensor], dict[str, Tensor], Tensor], ModelOutput]


@dataclass(frozen=True)
class LossInputs:
    """Everything a local objective may look at for one minibatch of one device."""

    out: ModelOutput
    y: Tensor
    present: Tensor                     # float [B, M]: sensor present in this sample
    held: tuple[str, ...]               # sensors the device holds
    trainable: Mapping[str, Tensor]     # parameter name -> live parameter being trained
    anchor: dict[str, Tensor]           # parameter name -> value received this round
    extras: dict[str, Tensor] = field(default_factory=dict)  # server extras, as tensors
    round: int = 0
    local: dict[str, Tensor] = field(default_factory=dict)   # from the `device_tensors` hook
    groups: tuple[str, ...] = ()        # parameter groups being trained this round
    #: float [B] sample weights on the lock-step path (1 = real sample, 0 = padding of a short
    #: last batch); None on the sequential path, where every row is real. See
    #: raymm.training.local_update.
    weight: Tensor | None = None
    #: the trainer adds the objective's proximal term (`Objective.proximal`) and its gradient
    #: itself: `loss` leaves it out
    proximal_outside: bool = False
    #: the minibatch's inputs per sensor as the forward pass of `out` saw them (after
    #: `Objective.augment`)
    x: dict[str, Tensor] = field(default_factory=dict)
    #: `forward(params, x, present)`: the module run again on other inputs or with other
    #: parameters (name -> tensor) in place of the ones `out` was made with (the others as
    #: there), e.g. a teacher whose vectors arrive as extras; gradients flow unless the caller
    #: stops them. None where a trainer offers none
    forward: ForwardFn | None = None


@dataclass(frozen=True)
class DeviceFinish:
    """What the optional `Objective.device_finish` hook sees after one device's local training.

    `start`/`end` are the trained groups' flat vectors before and after; `state` is what this
    objective's hooks kept for the device in earlier rounds (`DeviceState.objective`, see
    `raymm.protocol.device_state`); `steps` the optimizer steps taken.
    """

    device: int
    round: int
    groups: tuple[str, ...]
    start: dict[str, np.ndarray]
    end: dict[str, np.ndarray]
    state: dict[str, np.ndarray]
    extras: dict[str, np.ndarray]
    steps: int
    lr: float
    #: mean minibatch gradient per trained group over the local steps (filled only when the
    #: objective sets `needs_grad_mean = True`)
    grad_mean: dict[str, np.ndarray] = field(default_factory=dict)
    #: whether this round's extras reach the server (False between the syncs of a periodic
    #: exchange: what the hook returns as sent is dropped, so changes must be kept and sent
    #: summed at the next upload)
    upload: bool = True


#: (parameters by name, one minibatch) -> (its loss, the gradient per parameter; None where
#: the loss did not use it): a device's gradient function, as `Objective.local_steps` gets it
GradientFn = Callable[[dict[str, Tensor], Any], tuple[Tensor, Mapping[str, Tensor | None]]]


class Objective(Policy, ABC):
    """The local loss. Written functionally (no in-place parameter updates, no data-dependent
    Python branches inside) so it can be vmapped over devices.

    `loss` is the one method every objective writes. The hooks below run on the device's host
    (sequential and lock-step paths alike) and have defaults; the flags are False unless
    declared (as class attributes, or set in `__init__` from the parameters).
    """

    #: whether the device-local adapter is used when training
    uses_adapter: bool = False
    #: `loss` keeps the lock-step contract of `raymm.training.local_update` (vmappable, honours
    #: `LossInputs.weight`): devices may train in lock-step (`execution.training.path: lockstep`)
    vectorisable: bool = False
    #: with `uses_adapter`: trainers ask the model for the adapter-free task logits plus the
    #: adapter's own detached path (`ModelOutput.personal_logits`, see `MultimodalNet.forward`)
    #: instead of one path through it
    split_adapter: bool = False
    #: fill `DeviceFinish.grad_mean` (the mean minibatch gradient per trained group)
    needs_grad_mean: bool = False
    #: with `vectorisable`: devices of different sensor sets may share one lock-step program.
    #: The loss then learns which sensors a device holds from `inp.present` alone (`inp.held`
    #: and `inp.groups` are the bucket's union), and a parameter a device does not train may
    #: be among `inp.trainable` at its received value: the loss and its gradient with respect
    #: to the device's own parameters must not change for that (a proximal term's
    #: (θ - θ_received)² is zero there), and its gradient with respect to it is dropped
    mixes_sensor_sets: bool = False

    @abstractmethod
    def loss(self, inp: LossInputs) -> Tensor:
        """The scalar loss of one minibatch of one device (of many, under vmap)."""

    def proximal(self, trainable: Sequence[str]) -> tuple[float, tuple[str, ...]]:
        """(c, names): `loss` adds c * sum over `names` (some of the `trainable` parameters)
        of ||θ - θ_received||², and leaves it out when `LossInputs.proximal_outside` is set.
        A lock-step program under Adam then adds the term and its gradient 2c(θ - θ_received)
        on its flat parameter buffer (`raymm.training._kernels.lockstep_adam`): a few operations a
        step, where autograd takes several per parameter. Default: (0.0, ()), no such term."""
        return 0.0, ()

    def local_steps(self, params: dict[str, Tensor], batches: Iterator[Any],
                    grads_of: GradientFn) -> tuple[dict[str, Tensor], list[Tensor]] | None:
        """An update rule of the objective's own in place of "step the configured optimizer on
        `loss` once per minibatch" (M3Fed's Per-FedAvg meta step takes three minibatches a
        step): from the trained parameters, the device's minibatches
        (`raymm.training.local_update.Batch`, every epoch in order) and the gradient function
        of `loss`, return (the trained parameters as new tensors, one loss per step). Called
        once per device on the sequential path, only when the class writes it (such an
        objective cannot train in lock-step: `raymm.training.lockstep.fallback`); the
        optimizer keys of `training` are then unused and `DeviceFinish.grad_mean` stays
        empty. Default: None, no rule of its own (the optimizer steps every minibatch)."""
        return None

    def augment(self, xb: dict[str, Tensor], present: Tensor, held: tuple[str, ...],
                sensors: tuple[str, ...], gen: torch.Generator
                ) -> tuple[dict[str, Tensor], Tensor]:
        """Each minibatch's inputs and presence mask before the forward pass; random draws
        only from `gen`, the device's batch stream. It may append rows (a second view of
        every sample, as FLISM's contrastive loss needs): `out`, `x` and `present` then hold
        them too, `y` only the minibatch's (a loss that reads rows this way is not
        `vectorisable`). Default: unchanged, drawing nothing (a default `augment` lets the
        lock-step path draw every epoch's order at once)."""
        return xb, present

    def sensors_read(self, groups: tuple[str, ...], held: tuple[str, ...],
                     extras: Mapping[str, Tensor]) -> frozenset[str] | None:
        """The sensors whose embeddings or per-sensor logits `loss` reads when a device
        holding `held` trains `groups` with this round's `extras`; None (the default): it may
        read any output. A trainer then leaves the other sensors' encoders out (they reach the
        model as zero embeddings), so the outputs made from every sensor (`logits`, `z`) are
        not the real ones: declare a set only where the loss reads neither."""
        return None

    def device_tensors(self, state: dict[str, np.ndarray], extras: dict[str, np.ndarray],
                       layout: GroupLayout, groups: list[str]) -> dict[str, Tensor]:
        """Tensors handed to every loss call of the device as `LossInputs.local` (e.g.
        SCAFFOLD's control-variate correction), from what it kept (`state`) and the server's
        extras; called once per device before its local steps. Default: none."""
        return {}

    def device_extras(self, model: RaymmNet, xs: dict[str, Tensor], y: Tensor, held_t: Tensor,
                      use_adapter: bool) -> dict[str, np.ndarray]:
        """What the device reports besides its groups (e.g. TIDE's class means), computed with
        the trained module on all its training samples, after its local steps. Default:
        nothing (the module is then not reloaded per device on the lock-step path)."""
        return {}

    def device_finish(self, fin: DeviceFinish
                      ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """(state updates, uplink extras) after one device's local training: what the device
        keeps for later rounds (e.g. its control variate) and what it sends besides its
        groups. Default: nothing (and the start vectors are then not copied)."""
        return {}, {}

    def eval_predict(self, out: ModelOutput, held: tuple[str, ...], extras: dict[str, Tensor]
                     ) -> dict[str, Tensor]:
        """Predictors besides the logits in per-device evaluation, reported as `acc_<name>`
        (e.g. FedProto's nearest prototype). Default: none."""
        return {}

