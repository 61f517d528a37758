"""Sparse models: spike-and-slab regression, gated classifiers and gated networks with any loss."""

from .autoguide import AutoHardConcrete, auto_guide_list
from .classifier import SparseClassifier
from .regression import SparseLinearRegression, SparseLogisticRegression
from .sparse_model import SparseModel

__all__ = [
    "AutoHardConcrete",
    "auto_guide_list",
    "SparseClassifier",
    "SparseLinearRegression",
    "SparseLogisticRegression",
    "SparseModel",
]
