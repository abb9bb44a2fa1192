"""A model run on the same inputs under several sensor masks, as evaluation does.

An evaluation asks for one batch of samples with every sensor, with each sensor alone, with
each tier's sensors: a masked-out sensor's input is zeros and its presence 0, exactly as a
device lacking it sees it in training. Run as whole forward passes, every pass runs every
encoder again, on the same real inputs or on the same zeros. A model that takes embeddings
(`RaymmNet.takes_embeddings`) gets each sensor's encoder run at most twice instead, once on
its real inputs and once on zeros, and the rest of the model once per mask: the same
operations on the same tensors, so the same numbers, with a third (two sensors, three masks)
to a half (four masks) of the encoder runs gone.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Mapping

import torch
from torch import Tensor, nn

from raymm.models.network import ModelOutput, RaymmNet


class MaskedForward:
    """`model` on one batch, `xs` (every sensor's real inputs, in the model's sensor order),
    under any sensor mask; each sensor's embeddings are kept between calls. Call it under
    `torch.no_grad()` and `evaluating(model)`, and do not change the model's parameters
    between calls."""

    def __init__(self, model: RaymmNet, xs: Mapping[str, Tensor]) -> None:
        self.model, self.xs = model, dict(xs)
        first = next(iter(self.xs.values()))
        self.n, self.device = int(first.shape[0]), first.device   # a GPU host's rows: its GPU
        self._embeddings: dict[tuple[str, bool], Tensor] = {}

    def embedding(self, sensor: str, real: bool) -> Tensor:
        """The sensor's encoder on its real inputs, or on zeros of their shape."""
        key = (sensor, real)
        if key not in self._embeddings:
            x = self.xs[sensor] if real else torch.zeros_like(self.xs[sensor])
            encoders = self.model.encoders
            assert isinstance(encoders, nn.ModuleDict)   # `takes_embeddings` promises them
            self._embeddings[key] = encoders[sensor](x)
        return self._embeddings[key]

    def __call__(self, mask: Iterable[bool], use_adapter: bool = False) -> ModelOutput:
        """The model with the sensors outside `mask` (aligned with `xs`) zeroed and marked
        absent."""
        on = [bool(v) for v in mask]
        present = torch.tensor([on], dtype=torch.float32, device=self.device).expand(self.n, -1)
        if not self.model.takes_embeddings:
            xb = {m: x if o else torch.zeros_like(x) for (m, x), o in zip(self.xs.items(), on)}
            return self.model(xb, present, use_adapter=use_adapter)
        emb = {m: self.embedding(m, o) for m, o in zip(self.xs, on)}
        return self.model(self.xs, present, use_adapter=use_adapter, embeddings=emb)


@contextlib.contextmanager
def evaluating(model: nn.Module) -> Iterator[None]:
    """`model` in eval mode for the block and in training mode after it; nothing changes (no
    walk over the modules) when it is in eval mode already, e.g. inside an outer block that
    evaluates many devices with one model."""
    if not model.training:
        yield
        return
    model.eval()
    try:
        yield
    finally:
        model.train()
