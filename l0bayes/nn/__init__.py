"""Neural-network building blocks with hard concrete gates (Sections 2.3-2.4)."""

from .density import expected_density, test_time_density
from .export import load_pruned, save_pruned
from .gates import (
    HardConcreteGate,
    gate_prior,
    gates_of,
    init_log_alpha,
    log_alpha_for_inclusion,
    prior_like,
    pyro_gates,
)
from .layers import L0Conv2d, L0Layer, L0Linear, init_weights_
from .networks import L0MLP, MLP, L0LeNet5, LeNet5, lenet5_flat_size
from .penalty import expected_l0, expected_l2, l0_layers, penalty
from .prune import (
    PruneReport,
    SelectFeatures,
    architecture,
    count_parameters,
    expected_flops,
    flops,
    prune,
)
from .sparsify import GatedLayer, Group, GroupGate, sparsify, strip_gates
from .wrn import WideResNet, l0_wide_resnet

__all__ = [
    "HardConcreteGate",
    "gate_prior",
    "gates_of",
    "init_log_alpha",
    "init_weights_",
    "log_alpha_for_inclusion",
    "prior_like",
    "pyro_gates",
    "L0Conv2d",
    "L0Layer",
    "L0Linear",
    "MLP",
    "L0LeNet5",
    "L0MLP",
    "LeNet5",
    "lenet5_flat_size",
    "expected_density",
    "expected_l0",
    "expected_l2",
    "l0_layers",
    "penalty",
    "PruneReport",
    "SelectFeatures",
    "architecture",
    "count_parameters",
    "expected_flops",
    "flops",
    "prune",
    "test_time_density",
    "load_pruned",
    "save_pruned",
    "GatedLayer",
    "Group",
    "GroupGate",
    "sparsify",
    "strip_gates",
    "WideResNet",
    "l0_wide_resnet",
]
