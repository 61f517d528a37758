"""Which device a run uses (shared by :mod:`~l0bayes.inference.training` and :mod:`~l0bayes.inference.distributed`)."""

import torch

__all__ = ["resolve_device"]


def resolve_device(device="auto"):
    """``"auto"`` picks CUDA when available, else CPU; an unavailable ``"cuda"`` is a ``ValueError``."""
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was requested but CUDA is not available")
    return device
