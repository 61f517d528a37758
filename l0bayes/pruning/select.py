"""The parameter-free selection of kept units that a pruned network puts in front of a smaller layer."""

import torch
from torch import nn

__all__ = ["SelectFeatures"]


class SelectFeatures(nn.Module):
    """Parameter-free selection of the kept units along dimension ``dim``: ``x.index_select(dim, index)``.

    ``index`` is a buffer (moves with ``.to()``, no parameters, no FLOPs counted).
    """

    def __init__(self, index, num_inputs, dim=1):
        super().__init__()
        self.register_buffer("index", torch.as_tensor(index, dtype=torch.long))
        self.num_inputs = int(num_inputs)
        self.dim = int(dim)

    def extra_repr(self):
        return f"{self.index.numel()} of {self.num_inputs}" + (f", dim={self.dim}" if self.dim != 1 else "")

    def forward(self, x):
        if not -x.dim() <= self.dim < x.dim():
            shape = tuple(x.shape)
            raise ValueError(f"SelectFeatures selects along dimension {self.dim}, got an input of shape {shape}")
        if x.shape[self.dim] != self.num_inputs:
            raise ValueError(
                f"SelectFeatures keeps {self.index.numel()} of {self.num_inputs} inputs along dimension {self.dim}, "
                f"got an input of width {x.shape[self.dim]} there (shape {tuple(x.shape)})"
            )
        return x.index_select(self.dim, self.index)
