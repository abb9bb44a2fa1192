"""Attention fusion (`model.fusion: attention`): the sensors' embeddings are tokens, pooled by
additive self-attention with several heads, absent sensors masked out.

Per head h and sensor m with embedding e_m (every sensor's of one size E):

    s_{h,m} = w2_h · tanh(W1 e_m + b1)
    a_{h,m} = softmax over the PRESENT sensors m of s_{h,m}     (an absent sensor: a = 0)
    p       = concat_h Σ_m a_{h,m} e_m                          ([H·E])
    z       = ReLU(W p + b)                                     ([fusion_dim])

the pooling of FedMultimodal's `FuseBaseSelfAttention` (there over the time steps of both
sensors, here over the sensor embeddings, since raymm's encoders give one vector per sensor),
then the first layer of its classifier; the task head (`MultimodalNet.head`) is the second.

FedMultimodal's scoring layer has a bias b2_h too; it adds the same number to every sensor's
score of head h, which the softmax cancels, so it changes no output and its true gradient is 0.
It is left out: its computed gradient is float rounding, which Adam would scale up to full
steps of a parameter that means nothing (and differently on the lock-step path).

An absent sensor gets weight exactly 0 (masked, not zero-filled): its score is replaced by the
lowest float before the softmax, whose exponential underflows to 0. A sample with no sensor
present pools to the zero vector (its weights are multiplied by the mask after the softmax),
never NaN, so padded rows and sensor-less evaluations stay finite. Everything is batched
tensor algebra, so the module runs under `vmap` (lock-step training) as it is.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


def equal_embedding_dim(dims: dict[str, int]) -> int:
    """The one embedding size every sensor shares, or a ValueError naming the sizes."""
    sizes = set(dims.values())
    if len(sizes) != 1:
        raise ValueError(
            "model.fusion: attention pools the sensors' embeddings, which needs them all of "
            f"one size (model.embed_dim); got {dims} (an `identity` encoder's embedding is its "
            "flattened input: give every sensor an encoder of embed_dim outputs)")
    return sizes.pop()


class AttentionPool(nn.Module):
    """Masked multi-head additive attention over sensor tokens: `[B, M, E]` tokens and a
    float `[B, M]` presence mask -> `[B, H·E]` (see the module docstring)."""

    def __init__(self, embed_dim: int, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.score = nn.Linear(embed_dim, hidden)   # W1, b1
        self.weigh = nn.Linear(hidden, heads, bias=False)   # w2_h, one row per head

    def weights(self, tokens: Tensor, present: Tensor) -> Tensor:
        """a `[B, M, H]`: each head's softmax over the present sensors, 0 for absent ones."""
        scores = self.weigh(torch.tanh(self.score(tokens)))
        mask = (present > 0).unsqueeze(-1)
        scores = torch.where(mask, scores, torch.finfo(scores.dtype).min)
        # a row with no sensor present softmaxes uniformly over equal scores; the mask then
        # zeroes it, where a -inf fill would give 0/0
        return torch.softmax(scores, dim=1) * mask.to(scores.dtype)

    def forward(self, tokens: Tensor, present: Tensor) -> Tensor:
        a = self.weights(tokens, present)
        pooled = torch.einsum("bmh,bme->bhe", a, tokens)
        return pooled.reshape(tokens.shape[0], -1)


class AttentionFusion(nn.Module):
    """The fusion layer of `model.fusion: attention`: `AttentionPool` then a `Linear` + `ReLU`
    to `fusion_dim`, so that z has the size it has under concat fusion (the adapter, TIDE's
    prototypes and FedProto's take it as they are)."""

    def __init__(self, embed_dim: int, hidden: int, heads: int, fusion_dim: int) -> None:
        super().__init__()
        self.pool = AttentionPool(embed_dim, hidden, heads)
        self.project = nn.Linear(heads * embed_dim, fusion_dim)

    def forward(self, tokens: Tensor, present: Tensor) -> Tensor:
        return torch.relu(self.project(self.pool(tokens, present)))
