"""The sizes of a gated network before and after :func:`~l0bayes.pruning.prune`: Table 1 and Fig. 3 in one report."""

from dataclasses import dataclass, field

import torch
from torch import nn

from ..nn.density import architecture
from ..threads import under_thread_policy
from .counting import count_parameters, flops
from .prune import prune
from .size import expected_flops

__all__ = ["PruneReport"]


@dataclass
class PruneReport:
    """Sizes of a gated network before and after :func:`~l0bayes.pruning.prune` (Table 1, Fig. 3).

    ``params_*`` from :func:`~l0bayes.pruning.count_parameters` (gates excluded), ``flops_*`` from
    :func:`~l0bayes.pruning.flops`, ``expected_flops`` from :func:`~l0bayes.pruning.expected_flops` (the
    training-time cost under q(z != 0)).
    """

    architecture: str
    params_dense: int
    params_pruned: int
    flops_dense: int
    flops_pruned: int
    expected_flops: float
    pruned: nn.Module | None = field(default=None, repr=False, compare=False)

    @classmethod
    @under_thread_policy
    def from_model(cls, module, input_shape):
        """Prune ``module`` (kept in :attr:`pruned`) and count both; ``input_shape`` without batch dim.

        Runs under :func:`~l0bayes.threads.thread_policy` (one intra-op thread unless you chose otherwise).
        """
        pruned = prune(module)
        with torch.no_grad():
            expected = float(expected_flops(module, input_shape))
        return cls(
            architecture=architecture(module),
            params_dense=count_parameters(module),
            params_pruned=count_parameters(pruned),
            flops_dense=flops(module, input_shape),
            flops_pruned=flops(pruned, input_shape),
            expected_flops=expected,
            pruned=pruned,
        )

    @property
    def compression(self):
        """``params_dense / params_pruned``."""
        return self.params_dense / max(self.params_pruned, 1)

    @property
    def speedup(self):
        """``flops_dense / flops_pruned``."""
        return self.flops_dense / max(self.flops_pruned, 1)

    def summary(self):
        """A small text table."""
        rows = [
            ("", "dense", "pruned", "ratio"),
            ("parameters", f"{self.params_dense:,}", f"{self.params_pruned:,}", f"{self.compression:.2f}x"),
            ("FLOPs", f"{self.flops_dense:,}", f"{self.flops_pruned:,}", f"{self.speedup:.2f}x"),
        ]
        widths = [max(len(r[k]) for r in rows) for k in range(4)]
        lines = [f"architecture (Eq. 13 gates open): {self.architecture}"]
        for row in rows:
            cells = [
                cell.ljust(w) if k == 0 else cell.rjust(w) for k, (cell, w) in enumerate(zip(row, widths, strict=True))
            ]
            lines.append("  ".join(cells))
        lines.append(f"expected FLOPs under q(z != 0) (Fig. 3): {self.expected_flops:,.0f}")
        return "\n".join(lines)
