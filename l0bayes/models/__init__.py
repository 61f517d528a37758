"""Sparse models: spike-and-slab regression and gated classifiers with hard concrete gates."""

from .classifier import SparseClassifier
from .regression import SparseLinearRegression, SparseLogisticRegression

__all__ = ["SparseClassifier", "SparseLinearRegression", "SparseLogisticRegression"]
