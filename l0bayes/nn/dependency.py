"""The former home of :mod:`l0bayes.pruning.dependency`: these names still import from here."""

from ..pruning.dependency import Unit, prune_graph, structure, units

__all__ = ["Unit", "prune_graph", "structure", "units"]
