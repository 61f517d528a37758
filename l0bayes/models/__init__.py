"""Sparse models: spike-and-slab regression and gated classifiers with hard concrete gates."""

from .autoguide import AutoHardConcrete, auto_guide_list
from .classifier import SparseClassifier
from .regression import SparseLinearRegression, SparseLogisticRegression

__all__ = [
    "AutoHardConcrete",
    "auto_guide_list",
    "SparseClassifier",
    "SparseLinearRegression",
    "SparseLogisticRegression",
]
