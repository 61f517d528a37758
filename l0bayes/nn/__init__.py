"""Neural-network building blocks with hard concrete gates (Sections 2.3-2.4).

Gates, gated layers, the paper's networks, the penalties of Eq. 9 and 15-17 and the gate-level density of
a gated network. Pruning (``sparsify``, ``prune``, the FLOP counts, the density the pruned model keeps,
``save_pruned``) lives one floor up, in :mod:`l0bayes.pruning`.
"""

from .density import architecture, expected_gate_density, test_time_gate_density
from .gates import (
    HardConcreteGate,
    gate_owners,
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
from .wrn import WideResNet

__all__ = [
    "HardConcreteGate",
    "gate_owners",
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
    "architecture",
    "expected_gate_density",
    "expected_l0",
    "expected_l2",
    "l0_layers",
    "penalty",
    "test_time_gate_density",
    "WideResNet",
]
