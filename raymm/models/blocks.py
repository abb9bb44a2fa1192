"""The fusion layer with its first weight held as one column block per sensor.

Concat fusion computes z = ReLU(W [e_1; …; e_M] + b). Splitting W by columns,
W = [W^(1) | … | W^(M)], gives W [e_1; …; e_M] = Σ_m W^(m) e_m: the same layer, but each block
W^(m) only ever multiplies sensor m's embedding. `model.fusion_blocks: sensor` holds the blocks
as separate parameters (`fusion.blocks.<m>`) so that `MultimodalNet.group_of` can put W^(m) in
sensor m's group `sensor:<m>` and the bias in `shared`: with `training.upload: held` a device
then trains and sends only the blocks of the sensors it holds, and the per-group mean of
`fedavg` averages each block over the devices that hold that sensor (RELIEF's cohort-wise
aggregation, docs/methods/relief.md).

The forward pass concatenates the blocks back into W and runs the one product the plain layer
runs, so a split model gives the plain model's numbers bit for bit, and the blocks start from
the plain layer's own initial values (same random draws, same order).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

#: the name of the blocks inside the fusion module (`fusion.blocks.<m>`)
BLOCKS = "blocks"


class BlockFusion(nn.Module):
    """z = ReLU([W^(1) | … | W^(M)] [e_1; …; e_M] + b) with W^(m) the parameter
    `blocks.<m>` (shape [fusion_dim, E_m]) and b the parameter `bias`."""

    def __init__(self, dims: dict[str, int], out_features: int) -> None:
        super().__init__()
        # drawn as the plain layer draws them, so both models start from the same weights
        plain = nn.Linear(sum(dims.values()), out_features)
        parts = plain.weight.detach().split(list(dims.values()), dim=1)
        self.blocks = nn.ParameterDict({m: nn.Parameter(w.clone())
                                        for m, w in zip(dims, parts)})
        self.bias = nn.Parameter(plain.bias.detach().clone())
        self.order = tuple(dims)

    def weight(self) -> Tensor:
        """The whole first weight W [fusion_dim, Σ_m E_m], the blocks in sensor order."""
        blocks = [self.blocks[m] for m in self.order]
        return blocks[0] if len(blocks) == 1 else torch.cat(blocks, dim=1)

    def forward(self, joined: Tensor) -> Tensor:
        """`joined`: the sensors' embeddings concatenated in sensor order, [B, Σ_m E_m]."""
        return F.relu(F.linear(joined, self.weight(), self.bias))


def block_sensor(param_name: str) -> str | None:
    """The sensor whose column block `param_name` is (`fusion.blocks.<m>`), else None."""
    top, _, rest = param_name.partition(".")
    kind, _, sensor = rest.partition(".")
    return sensor if top == "fusion" and kind == BLOCKS and sensor else None
