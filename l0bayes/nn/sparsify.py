"""The former home of :mod:`l0bayes.pruning.sparsify`: these names still import from here."""

from ..pruning.sparsify import GatedLayer, Group, GroupGate, sparsify, strip_gates

__all__ = ["GatedLayer", "Group", "GroupGate", "sparsify", "strip_gates"]
