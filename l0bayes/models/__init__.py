"""Sparse models: spike-and-slab regression with hard concrete gates."""

from .regression import SparseLinearRegression, SparseLogisticRegression

__all__ = ["SparseLinearRegression", "SparseLogisticRegression"]
