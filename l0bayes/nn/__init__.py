"""Neural-network building blocks with hard concrete gates (Sections 2.3-2.4).

Gates, gated layers, the paper's networks, the penalties of Eq. 9 and 15-17 and the gate-level density of
a gated network. Pruning (``sparsify``, ``prune``, the FLOP counts, the density the pruned model keeps,
``save_pruned``) lives one floor up, in :mod:`l0bayes.pruning`; its names still import from here, as do
the modules ``l0bayes.nn.sparsify``, ``l0bayes.nn.prune``, ``l0bayes.nn.dependency`` and
``l0bayes.nn.export`` that held them.
"""

import importlib
import sys
import types

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

# The names that moved to l0bayes.pruning, imported from there on first use: l0bayes.pruning builds on
# this package, so importing it here would be a cycle.
_MOVED = (
    "expected_density",
    "expected_flops_fraction",
    "test_time_density",
    "test_time_flops_fraction",
    "GatedLayer",
    "Group",
    "GroupGate",
    "PruneReport",
    "SelectFeatures",
    "count_parameters",
    "expected_flops",
    "flops",
    "l0_wide_resnet",
    "load_pruned",
    "prune",
    "save_pruned",
    "sparsify",
    "strip_gates",
)
# The modules that held them: l0bayes.nn.export and l0bayes.nn.dependency are modules, as they were.
_FORMER_MODULES = ("dependency", "export")

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
    *_MOVED,
]


def __getattr__(name):
    if name in _MOVED:
        from .. import pruning

        return getattr(pruning, name)
    if name in _FORMER_MODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__) | set(_FORMER_MODULES))


class _Package(types.ModuleType):
    """This package, keeping ``l0bayes.nn.prune`` and ``l0bayes.nn.sparsify`` the functions they always were.

    Importing the former module ``l0bayes.nn.prune`` binds it as this package's attribute ``prune``; before
    the move the function was bound last and won. The binding of those two modules is skipped, so that
    ``from l0bayes.nn import prune`` gives the function whatever was imported first.
    """

    def __setattr__(self, name, value):
        if name in ("prune", "sparsify") and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
