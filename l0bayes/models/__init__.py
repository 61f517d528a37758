"""Sparse models: spike-and-slab regression, gated classifiers and gated networks with any loss.

``VariableSelector`` (a scikit-learn selector) is imported on first use (PEP 562): it loads scikit-learn.
"""

from typing import TYPE_CHECKING

from .autoguide import AutoHardConcrete, auto_guide_list
from .classifier import SparseClassifier
from .distillation import Distillation, DistillationOutput
from .plain_model import PlainModel
from .regression import SparseLinearRegression, SparseLogisticRegression
from .sparse_model import SparseModel

if TYPE_CHECKING:  # pragma: no cover - for static analysis and documentation tools
    from .selector import VariableSelector

__all__ = [
    "AutoHardConcrete",
    "auto_guide_list",
    "Distillation",
    "DistillationOutput",
    "PlainModel",
    "SparseClassifier",
    "SparseLinearRegression",
    "SparseLogisticRegression",
    "SparseModel",
    "VariableSelector",
]


def __getattr__(name):
    if name == "VariableSelector":
        from .selector import VariableSelector

        return VariableSelector
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
