"""Keep every gate's ``log_alpha`` in a range after each step (the paper's code: ``[log 0.01, log 100]``)."""

import torch

from ..._checks import FINITE, check_args
from ...nn.gates import gates_of
from .base import Callback

__all__ = ["LogAlphaProjection"]


class LogAlphaProjection(Callback):
    """After every optimiser step, project each gate's ``log_alpha`` onto ``[low, high]``.

    With ``(log 0.01, log 100)``, the paper code's range, a kept gate stays exactly 1 only with
    probability about 0.95 (Eq. 12 at ``temperature=2/3``), so some gate noise remains for the whole
    run instead of vanishing as ``log_alpha`` grows without bound.

    :param low, high: the range, ``low < high``.
    """

    before_records = True

    def __init__(self, low, high):
        check_args("LogAlphaProjection", {"low": FINITE, "high": FINITE}, low=low, high=high)
        self.low, self.high = float(low), float(high)
        if not self.low < self.high:
            raise ValueError(f"LogAlphaProjection: low must be below high, got low={low!r}, high={high!r}")
        self.log_alphas = None

    def setup(self, run):
        self.log_alphas = [g.log_alpha for _, g in gates_of(run.model)]

    @torch.no_grad()
    def on_step_end(self, run):
        torch._foreach_clamp_min_(self.log_alphas, self.low)
        torch._foreach_clamp_max_(self.log_alphas, self.high)
