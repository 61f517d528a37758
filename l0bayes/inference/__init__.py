"""Inference: the free energy of Eq. 21 and training."""

from .free_energy import FreeEnergy, free_energy
from .training import NonFiniteLossError, TrainResult, resolve_device, train

__all__ = ["FreeEnergy", "free_energy", "NonFiniteLossError", "TrainResult", "resolve_device", "train"]
