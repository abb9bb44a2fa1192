"""The multimodal network and the parameter groups that travel.

Groups: `sensor:<m>` = encoder E_m (+ its own head H_m when the model has per-sensor heads,
+ its column block W^(m) of the fusion layer's first weight with `model.fusion_blocks: sensor`),
`shared` = fusion F + task head H (absent for late fusion by summing logits), and `local` = the
device-local residual adapter that never leaves a device. Each group is one flat float32 vector.
"""

from __future__ import annotations

from abc import ABCMeta, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from raymm.config.schema import ModelSpec
from raymm.models.attention import AttentionFusion, equal_embedding_dim
from raymm.models.blocks import BlockFusion, block_sensor
from raymm.models.encoders import auto_kind, embedding_dim, make_encoder

SHARED = "shared"
LOCAL = "local"


def sensor_group(m: str) -> str:
    return f"sensor:{m}"


@dataclass(frozen=True)
class ModelOutput:
    logits: Tensor                   # [B, C] task prediction
    z: Tensor | None                 # [B, F] fused representation (None for logit fusion)
    embeddings: dict[str, Tensor]    # sensor -> [B, E]
    sensor_logits: dict[str, Tensor]  # sensor -> [B, C] (per-sensor heads, when present)
    #: fused representation before the device-local adapter (`z` is after it); what TIDE's
    #: prototypes live on, since the global model is evaluated without the adapter
    z_base: Tensor | None = None
    #: [B, C] the device's own prediction H̄(z̄ + A(z̄)) on the personal path (only with
    #: `split_adapter=True`): its gradient reaches the adapter and nothing else
    personal_logits: Tensor | None = None
    #: [B, K] the private branch's code (`model.private: [branch]`, FDARN's egocentric encoder;
    #: `logits` then holds the shared and the private logits summed)
    private_code: Tensor | None = None


class RaymmNet(nn.Module, metaclass=ABCMeta):
    """What raymm trains and exchanges: `forward(inputs, present, use_adapter, split_adapter)`
    gives a `ModelOutput`, `group_of(name)` names the travelling group of a parameter (or
    buffer). `MultimodalNet` is raymm's own; `raymm.models.factory` wraps a user's module."""

    sensors: tuple[str, ...]
    #: per-sensor classifiers (`sensor:<m>` groups), when the model has them
    heads: nn.ModuleDict | None
    #: the fusion layer (None: logit fusion, or a whole model without parts)
    fusion: nn.Module | None
    #: the device-local residual adapter (group `local`), when the model has one
    adapter: nn.Module | None
    #: `forward` takes `embeddings` (sensor -> [B, E]) computed elsewhere in place of running
    #: `encoders[m]` (an `nn.ModuleDict` per sensor) on those sensors: lock-step training then
    #: runs a sensor's encoder only for the devices that hold it
    #: (`raymm.training.lockstep.encoders`)
    takes_embeddings: bool = False

    @abstractmethod
    def forward(self, inputs: dict[str, Tensor], present: Tensor, use_adapter: bool = False,
                split_adapter: bool = False) -> ModelOutput:
        """Every sensor's input (zeros for a missing one) and the float presence mask
        `[B, M]` -> the model's output; the flags only matter to a model with an adapter."""

    @abstractmethod
    def group_of(self, param_name: str) -> str:
        """The travelling group (`sensor:<m>`, `shared`, `local`) of a parameter or buffer."""


def consensus_projection(dims: Mapping[str, int]) -> nn.Linear:
    """G: a square map of the sensors' common embedding width, without bias, starting as the
    identity (the network computes what it would without G until G learns)."""
    widths = set(dims.values())
    if len(widths) != 1:
        raise ValueError("model.consensus needs every sensor's embedding of one width "
                         f"(got {dict(dims)}): no identity encoders")
    width = widths.pop()
    g = nn.Linear(width, width, bias=False)
    with torch.no_grad():
        g.weight.copy_(torch.eye(width))
    return g


def code_of(z: Tensor | None, emb: Mapping[str, Tensor], present: Tensor) -> Tensor:
    """The representation a network's classifier reads, as one [B, K] code per sample: the
    fused `z`, or under logit fusion the sensors' embeddings side by side, an absent sensor's
    zeroed (FDARN's shared and private codes)."""
    if z is not None:
        return z
    return torch.cat([e * present[:, j:j + 1] for j, e in enumerate(emb.values())], dim=1)


def sensor_sets(sensors: tuple[str, ...]) -> int:
    """How many non-empty sets of the sensors there are: FDARN's modality domains."""
    return 2 ** len(sensors) - 1


class ModalityDiscriminator(nn.Module):
    """FDARN's modality discriminator: a layer Linear(code, width) + ReLU and the ArcFace
    class weights `arc` [domains, width] (xavier-uniform, as ArcFace's). The model never
    calls it: the fdarn objective reads its parameters (`discriminator.*`) and applies it
    to the shared code through gradient reversal and to the private code as it is."""

    def __init__(self, code_dim: int, width: int, domains: int) -> None:
        super().__init__()
        self.layer = nn.Linear(code_dim, width)
        self.arc = nn.Parameter(torch.empty(domains, width))
        nn.init.xavier_uniform_(self.arc)


def embed(encoders: nn.ModuleDict, sensors: tuple[str, ...], inputs: dict[str, Tensor],
          given: Mapping[str, Tensor] | None) -> dict[str, Tensor]:
    """Every sensor's embedding: the given one, else its encoder on its input."""
    given = given or {}
    return {m: given[m] if m in given else encoders[m](inputs[m]) for m in sensors}


class MultimodalNet(RaymmNet):
    """Per-sensor encoders, optional per-sensor heads, and a fusion + task head.

    `forward(inputs, present)` takes every sensor's input (zeros for a missing sensor) and a
    float `present` mask `[B, M]`. Concat fusion feeds all embeddings (a zero input still goes
    through its encoder, as in TIDE: docs/methods/tide.md); logit fusion sums the heads of the
    present sensors only (FedMChain's late fusion: docs/methods/fedmchain.md); attention fusion
    pools the present sensors' embeddings with weights that give an absent sensor exactly 0
    (FedMultimodal: raymm.models.attention, docs/methods/fedmultimodal.md). The adapter's
    bottleneck is `model.adapter_bottleneck` × fusion_dim: 0.5 by default (what every committed
    TIDE table ran with), TIDE's design asks for at most 0.25 (docs/methods/tide.md).
    """

    takes_embeddings = True

    def __init__(self, sensors: tuple[str, ...], shapes: dict[str, tuple[int, ...]],
                 num_classes: int, spec: ModelSpec) -> None:
        super().__init__()
        self.sensors = tuple(sensors)
        self.spec = spec
        kinds = {m: spec.encoders.get(m, spec.encoder if spec.encoder != "auto"
                                      else auto_kind(shapes[m])) for m in sensors}
        dims = {m: embedding_dim(kinds[m], shapes[m], spec.embed_dim) for m in sensors}
        self.encoders = nn.ModuleDict({
            m: make_encoder(kinds[m], shapes[m], spec.embed_dim, spec.hidden) for m in sensors})
        heads = spec.aux_heads or spec.fusion == "sum_logits"
        self.heads = nn.ModuleDict({m: nn.Linear(dims[m], num_classes)
                                    for m in sensors}) if heads else None
        #: attention fusion: `fusion(tokens [B, M, E], present)` in place of the concatenation
        self.attends = spec.fusion == "attention"
        if spec.fusion in ("concat", "attention"):
            self.fusion = AttentionFusion(equal_embedding_dim(dims), spec.attention_hidden,
                                          spec.attention_heads, spec.fusion_dim) \
                if self.attends else BlockFusion(dims, spec.fusion_dim) \
                if spec.fusion_blocks == "sensor" else nn.Sequential(
                    nn.Linear(sum(dims.values()), spec.fusion_dim), nn.ReLU())
            self.head = nn.Linear(spec.fusion_dim, num_classes)
            width = max(1, int(spec.fusion_dim * spec.adapter_bottleneck))
            self.adapter = nn.Sequential(nn.Linear(spec.fusion_dim, width), nn.ReLU(),
                                         nn.Linear(width, spec.fusion_dim)) \
                if spec.adapter else None
            if self.adapter is not None:
                # residual adapter starts as the identity (z' = z): a random A(z) would shift the
                # representation the shared head is trained on away from the adapter-free one
                # the global model is evaluated with, for every device, from round 1
                up = self.adapter[2]
                assert isinstance(up, nn.Linear)
                nn.init.zeros_(up.weight)
                nn.init.zeros_(up.bias)
        else:
            self.fusion = self.head = self.adapter = None  # type: ignore[assignment]
        #: FDARN's private network beside this one (`model.private: [branch]`, group
        #: `private`): the same form without the options that belong to the shared network
        self.branch = MultimodalNet(sensors, shapes, num_classes, spec.model_copy(update={
            "private": [], "discriminator": 0, "consensus": False, "adapter": False,
            "aux_heads": False, "fusion_blocks": "none"})) if "branch" in spec.private else None
        #: FDARN's modality discriminator (`model.discriminator`, in `shared`)
        self.discriminator = ModalityDiscriminator(
            spec.fusion_dim if self.fusion is not None else sum(dims.values()),
            spec.discriminator, sensor_sets(self.sensors)) if spec.discriminator else None
        #: M3Fed's consensus projection G on every sensor's embedding (`model.consensus`),
        #: registered last: its weight is the last E×E numbers of `shared`
        self.consensus = consensus_projection(dims) if spec.consensus else None

    def forward(self, inputs: dict[str, Tensor], present: Tensor,
                use_adapter: bool = False, split_adapter: bool = False,
                embeddings: Mapping[str, Tensor] | None = None) -> ModelOutput:
        """`use_adapter`: the task head sees `z + A(z)` (a device predicting for itself; the
        adapter's gradient then flows through the head and the encoders too). With
        `split_adapter` as well, the task head sees the adapter-free `z` (the path the global
        model is evaluated on) and `personal_logits` = H̄(z̄ + A(z̄)) is added, computed from
        detached values of z and of the head's parameters so that only the adapter learns
        from it. Without an adapter both flags change nothing. `embeddings`: see
        `takes_embeddings`."""
        out = self._shared(inputs, present, use_adapter, split_adapter, embeddings)
        return out if self.branch is None else self._add_branch(out, inputs, present)

    def _shared(self, inputs: dict[str, Tensor], present: Tensor, use_adapter: bool,
                split_adapter: bool, embeddings: Mapping[str, Tensor] | None) -> ModelOutput:
        """The network without FDARN's private branch (all of it, without `model.private:
        [branch]`)."""
        emb = embed(self.encoders, self.sensors, inputs, embeddings)
        if self.consensus is not None:   # G e_m: every sensor into the one consensus space
            emb = {m: self.consensus(e) for m, e in emb.items()}
        sensor_logits = {m: self.heads[m](emb[m]) for m in self.sensors} if self.heads else {}
        if self.fusion is None:
            logits = sum(sensor_logits[m] * present[:, j:j + 1]
                         for j, m in enumerate(self.sensors))
            return ModelOutput(logits, None, emb, sensor_logits)  # type: ignore[arg-type]
        if self.attends:
            z_base = self.fusion(torch.stack([emb[m] for m in self.sensors], dim=1), present)
        else:   # one sensor: its embedding as it is (a cat of one tensor would only copy it)
            z_base = self.fusion(emb[self.sensors[0]] if len(self.sensors) == 1 else
                                 torch.cat([emb[m] for m in self.sensors], dim=1))
        if not use_adapter or self.adapter is None:
            return ModelOutput(self.head(z_base), z_base, emb, sensor_logits, z_base)
        if split_adapter:
            z_own = z_base.detach()
            z_own = z_own + self.adapter(z_own)
            personal = F.linear(z_own, self.head.weight.detach(), self.head.bias.detach())
            return ModelOutput(self.head(z_base), z_base, emb, sensor_logits, z_base, personal)
        z = z_base + self.adapter(z_base)
        return ModelOutput(self.head(z), z, emb, sensor_logits, z_base)

    def _add_branch(self, shared: ModelOutput, inputs: dict[str, Tensor], present: Tensor
                    ) -> ModelOutput:
        """FDARN's prediction: the shared network's logits plus the private branch's, the
        branch run on the present sensors' inputs only (an absent sensor's input zeroed, as
        the data path gives it, even where an evaluation masks a held sensor)."""
        branch = self.branch
        assert branch is not None
        masked = {m: inputs[m] * present[:, j].reshape(-1, *([1] * (inputs[m].dim() - 1)))
                  for j, m in enumerate(self.sensors)}
        own = branch(masked, present)
        return replace(shared, logits=shared.logits + own.logits,
                       private_code=code_of(own.z_base, own.embeddings, present))

    def group_of(self, param_name: str) -> str:
        """The travelling group a parameter (named as in named_parameters) belongs to."""
        top, _, rest = param_name.partition(".")
        if top in ("encoders", "heads"):
            return sensor_group(rest.partition(".")[0])
        block = block_sensor(param_name)   # W^(m) of `model.fusion_blocks: sensor`
        if block is not None:
            return sensor_group(block)
        if top == "adapter":
            return LOCAL
        return SHARED
