"""Inference: the free energy of Eq. 21, training (a loop with callbacks), and data-parallel training under torchrun."""

from .averaging import ParameterAverage
from .callbacks import (
    Callback,
    EarlyStopping,
    ExpectedFlops,
    LogAlphaProjection,
    ParameterAveraging,
    StopWhenFixed,
    TensorBoard,
)
from .compiled import CompiledStep
from .device import resolve_device
from .distributed import DistributedConfig, DistributedError, is_main_process
from .errors import NonFiniteLossError
from .free_energy import FreeEnergy, free_energy
from .graphed import GraphedStep
from .loop import Run, fit
from .objectives import (
    Bayes,
    BayesObjective,
    Constrained,
    ConstrainedObjective,
    Objective,
    Penalized,
    PenalizedObjective,
    constrained_summary,
)
from .optimizers import clipped, parameter_groups
from .training import TrainResult, train

__all__ = [
    "Bayes",
    "BayesObjective",
    "Constrained",
    "ExpectedFlops",
    "LogAlphaProjection",
    "ParameterAveraging",
    "Penalized",
    "Callback",
    "EarlyStopping",
    "Run",
    "StopWhenFixed",
    "TensorBoard",
    "fit",
    "CompiledStep",
    "ConstrainedObjective",
    "Objective",
    "PenalizedObjective",
    "clipped",
    "constrained_summary",
    "DistributedConfig",
    "DistributedError",
    "FreeEnergy",
    "GraphedStep",
    "NonFiniteLossError",
    "ParameterAverage",
    "TrainResult",
    "free_energy",
    "is_main_process",
    "parameter_groups",
    "resolve_device",
    "train",
]
