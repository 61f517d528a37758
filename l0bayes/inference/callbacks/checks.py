"""Refuse to go on with a NaN or infinite parameter."""

import torch

from ..errors import NonFiniteLossError
from .base import Callback

__all__ = ["FiniteParameters"]


class FiniteParameters(Callback):
    """After every epoch, raise :class:`~l0bayes.inference.NonFiniteLossError` naming any parameter that
    became NaN or infinite (e.g. a ``log_alpha`` pushed to infinity), before it is recorded or saved."""

    def on_epoch_end(self, run, record):
        params = [p.detach() for p in run.model.parameters()]
        if params and not all(bool(torch.isfinite(p).all()) for p in params):
            names = [n for n, p in run.model.named_parameters() if not bool(torch.isfinite(p).all())]
            raise NonFiniteLossError(f"parameters {names} became NaN or infinite in epoch {run.epoch + 1}")
