"""Models a scenario names: factories registered by name, what each is called with, and what
raymm needs of the module a factory returns.

A scenario's `model.factory` names a registered factory (the built-in `multimodal` builds
`MultimodalNet`; plugins register their own with `register_model`), and `model.args` are its
keyword arguments. A factory receives a `ModelContext` (the sensors, each sensor's input shape,
the number of classes, the scenario's model section) and returns a `torch.nn.Module` in one of
three forms:

- **raymm's own network** (`MultimodalNet`, or any `RaymmNet`: `forward(inputs, present,
  use_adapter=False, split_adapter=False) -> ModelOutput` and `group_of(name)`), used as it is;
- **parts**: a module with `encoders` (an `nn.ModuleDict` with one encoder per sensor, input
  `[B, *shape]` -> embedding `[B, E_m]`), `head` (fused representation -> `[B, classes]`), and
  optionally `fusion` (the concatenated embeddings -> the fused representation; identity when
  absent) and `heads` (an `nn.ModuleDict`: each sensor's own classifier on its embedding). Each
  sensor's encoder (and head) travels as the group `sensor:<m>`, fusion and head as `shared`:
  what pod-wise merging, TIDE and FedMChain exchange;
- **whole**: any other module, called as `module(inputs)` with the dict of every sensor's input
  (zeros for a sensor the device lacks) and returning logits `[B, classes]`. All its parameters
  travel as one group, `shared`: enough for FedAvg, FedProx, SCAFFOLD and FedOpt.

`ModelFacts` says which of these a module is and what it has; `raymm validate` refuses a method
that needs parts the model lacks (`model_problems`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from raymm.config.schema import ModelSpec
from raymm.models.network import (
    LOCAL,
    SHARED,
    ModelOutput,
    MultimodalNet,
    RaymmNet,
    embed,
    sensor_group,
)


@dataclass(frozen=True)
class ModelContext:
    """What a model factory is called with."""

    sensors: tuple[str, ...]
    #: sensor -> input shape of one sample (without the batch dimension)
    shapes: Mapping[str, tuple[int, ...]]
    num_classes: int
    #: the scenario's model section; `spec.args` are the factory's own arguments
    spec: ModelSpec

    @property
    def args(self) -> dict[str, Any]:
        return dict(self.spec.args)


ModelFactory = Callable[[ModelContext], nn.Module]
#: factory name -> factory (`register_model`); the scenario's `model.factory` names one
MODELS: dict[str, ModelFactory] = {}


def register_model(name: str) -> Callable[[ModelFactory], ModelFactory]:
    """Register `fn(ctx: ModelContext) -> nn.Module` under `name` (a decorator)."""

    def deco(fn: ModelFactory) -> ModelFactory:
        if not callable(fn):
            raise TypeError(f"model factory {name!r} must be callable")
        if name in MODELS and MODELS[name] is not fn:
            raise ValueError(f"model factory {name!r} is registered twice")
        MODELS[name] = fn
        return fn

    return deco


@register_model("multimodal")
def multimodal(ctx: ModelContext) -> MultimodalNet:
    """raymm's own network: per-sensor encoders, concat or logit fusion, optional per-sensor
    heads and residual adapter, all set by the model section's own keys."""
    return MultimodalNet(ctx.sensors, dict(ctx.shapes), ctx.num_classes, ctx.spec)


# --------------------------------------------------------------------------- wrapped forms


class PartsNet(RaymmNet):
    """A user's parts (encoders, fusion, head, heads) run as concat fusion: z = fusion(cat of
    the embeddings), logits = head(z). Parameters keep the parts' own names."""

    takes_embeddings = True

    def __init__(self, parts: nn.Module, sensors: tuple[str, ...]) -> None:
        super().__init__()
        self.sensors = sensors
        encoders, head = parts.encoders, parts.head
        fusion, heads = getattr(parts, "fusion", None), getattr(parts, "heads", None)
        assert isinstance(encoders, nn.ModuleDict) and isinstance(head, nn.Module)
        self.encoders = encoders
        self.fusion = fusion if isinstance(fusion, nn.Module) else nn.Identity()
        self.head = head
        self.heads = heads if isinstance(heads, nn.ModuleDict) and len(heads) else None
        self.adapter = None

    def forward(self, inputs: dict[str, Tensor], present: Tensor, use_adapter: bool = False,
                split_adapter: bool = False, embeddings: Mapping[str, Tensor] | None = None
                ) -> ModelOutput:
        emb = embed(self.encoders, self.sensors, inputs, embeddings)
        sensor_logits = {m: self.heads[m](emb[m]) for m in self.sensors} if self.heads else {}
        fuse = self.fusion
        assert fuse is not None  # an identity when the parts have no fusion layer
        z = fuse(emb[self.sensors[0]] if len(self.sensors) == 1 else
                 torch.cat([emb[m] for m in self.sensors], dim=1))
        return ModelOutput(self.head(z), z, emb, sensor_logits, z)

    def group_of(self, name: str) -> str:
        top, _, rest = name.partition(".")
        return sensor_group(rest.partition(".")[0]) if top in ("encoders", "heads") else SHARED


class WholeNet(RaymmNet):
    """A user's whole model, `net(inputs) -> logits`: one group (`shared`), no parts."""

    def __init__(self, net: nn.Module, sensors: tuple[str, ...]) -> None:
        super().__init__()
        self.sensors = sensors
        self.net = net
        self.heads = self.adapter = self.fusion = None

    def forward(self, inputs: dict[str, Tensor], present: Tensor, use_adapter: bool = False,
                split_adapter: bool = False) -> ModelOutput:
        return ModelOutput(self.net(inputs), None, {}, {})

    def group_of(self, name: str) -> str:
        return SHARED


# --------------------------------------------------------------------------- facts


@dataclass(frozen=True)
class ModelFacts:
    """What a built model offers the methods."""

    #: "multimodal" (raymm's own), "parts" or "whole"
    form: str
    #: each sensor's encoder travels as its own group `sensor:<m>` (pod-wise merging, chains)
    sensor_groups: bool
    #: each sensor has its own classifier on its embedding (TIDE's auxiliary heads, FedMChain)
    sensor_heads: bool
    #: the task prediction is the sum of the present sensors' heads (FedMChain's late fusion)
    logit_fusion: bool
    #: a fused representation z exists (TIDE's prototypes, FedProto)
    fused: bool
    #: a device-local residual adapter exists (TIDE's personal path)
    adapter: bool

    @classmethod
    def of(cls, model: RaymmNet) -> ModelFacts:
        if isinstance(model, WholeNet):
            return cls("whole", False, False, False, False, False)
        heads, fusion = model.heads is not None, model.fusion is not None
        form = "parts" if isinstance(model, PartsNet) else "multimodal"
        return cls(form, True, heads, heads and not fusion, fusion, model.adapter is not None)

    def missing(self, needs: frozenset[str]) -> list[str]:
        """The facts among `needs` (names of the boolean fields) this model lacks."""
        return sorted(n for n in needs if not getattr(self, n))


#: what each need means, for refusals
NEEDS_TEXT = {
    "sensor_groups": "a per-sensor encoder for every sensor (a parts model: `encoders`)",
    "sensor_heads": "a classifier per sensor (`heads`)",
    "logit_fusion": "late fusion by summed per-sensor heads (model.fusion: sum_logits)",
    "fused": "a fused representation (a fusion layer: `fusion` + `head`)",
    "adapter": "a device-local residual adapter (model.adapter: true)",
}


class ModelContractError(TypeError):
    """A factory returned something raymm cannot train; the message names what is wrong."""


def as_raymm_model(module: object, ctx: ModelContext, factory: str) -> RaymmNet:
    """The factory's module in one of the three forms (see the module docstring), or a
    `ModelContractError` naming the field, the shape or the part that does not fit."""
    where = f"model.factory {factory!r}"
    if not isinstance(module, nn.Module):
        raise ModelContractError(f"{where} returned {type(module).__name__}, not a "
                                 "torch.nn.Module")
    if isinstance(module, RaymmNet):
        return module
    encoders = getattr(module, "encoders", None)
    if encoders is None:
        return WholeNet(module, ctx.sensors)
    if not isinstance(encoders, nn.ModuleDict):
        raise ModelContractError(f"{where}: `encoders` must be an nn.ModuleDict of one encoder "
                                 f"per sensor, got {type(encoders).__name__}")
    if set(encoders) != set(ctx.sensors):
        raise ModelContractError(f"{where}: `encoders` has {sorted(encoders)}, the dataset's "
                                 f"sensors are {list(ctx.sensors)}")
    if not isinstance(getattr(module, "head", None), nn.Module):
        raise ModelContractError(f"{where}: a parts model needs `head` (an nn.Module from the "
                                 "fused representation to the classes)")
    heads = getattr(module, "heads", None)
    if heads is not None and (not isinstance(heads, nn.ModuleDict) or
                              set(heads) != set(ctx.sensors)):
        raise ModelContractError(f"{where}: `heads` must be an nn.ModuleDict with one head per "
                                 f"sensor ({list(ctx.sensors)})")
    net = PartsNet(module, ctx.sensors)
    inside = {id(p) for p in net.parameters()} | {id(b) for b in net.buffers()}
    stray = [n for n, p in [*module.named_parameters(), *module.named_buffers()]
             if id(p) not in inside]
    if stray:
        raise ModelContractError(f"{where}: parameters outside encoders/fusion/head/heads would "
                                 f"never be trained or sent: {', '.join(stray[:5])}")
    return net


def build_from_factory(ctx: ModelContext) -> RaymmNet:
    """The scenario's factory called with `ctx`, its module in one of raymm's forms."""
    name = ctx.spec.factory
    if name not in MODELS:
        raise ModelContractError(f"model.factory: unknown model factory {name!r}; registered: "
                                 f"{', '.join(sorted(MODELS))}")
    return as_raymm_model(MODELS[name](ctx), ctx, name)


def check_output(model: RaymmNet, ctx: ModelContext, batch: int = 2) -> str | None:
    """Why the model's forward does not fit the data (None when it does): a forward pass of
    zeros of each sensor's shape must give logits `[batch, classes]`."""
    xs = {m: torch.zeros((batch,) + tuple(ctx.shapes[m])) for m in ctx.sensors}
    present = torch.ones(batch, len(ctx.sensors))
    try:
        with torch.no_grad():
            out = model.eval()(xs, present)
    except Exception as exc:  # noqa: BLE001 - any failure of user code is the message
        return (f"model.factory {ctx.spec.factory!r}: a forward pass on inputs of shapes "
                f"{ {m: list(ctx.shapes[m]) for m in ctx.sensors} } failed: "
                f"{type(exc).__name__}: {exc}")
    shape = tuple(out.logits.shape)
    if shape != (batch, ctx.num_classes):
        return (f"model.factory {ctx.spec.factory!r}: logits of shape {list(shape)} for a batch "
                f"of {batch}; expected [{batch}, {ctx.num_classes}] (one score per class)")
    return None


__all__ = ["LOCAL", "MODELS", "RaymmNet", "ModelContext", "ModelContractError", "ModelFacts",
           "PartsNet", "WholeNet", "as_raymm_model", "build_from_factory", "check_output",
           "register_model"]
