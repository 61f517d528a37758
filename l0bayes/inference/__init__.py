"""Inference: the free energy of Eq. 21, training, and data-parallel training under torchrun."""

from .distributed import DistributedConfig, DistributedError, is_main_process
from .free_energy import FreeEnergy, free_energy
from .training import NonFiniteLossError, ParameterAverage, TrainResult, resolve_device, train

__all__ = [
    "DistributedConfig",
    "DistributedError",
    "FreeEnergy",
    "NonFiniteLossError",
    "ParameterAverage",
    "TrainResult",
    "free_energy",
    "is_main_process",
    "resolve_device",
    "train",
]
