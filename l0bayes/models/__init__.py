"""Sparse models: spike-and-slab regression, gated classifiers and gated networks with any loss.

Variable selection (``select_variables``, ``VariableSelector``) is in :mod:`l0bayes.selection`.
"""

from .autoguide import AutoHardConcrete, auto_guide_list
from .classifier import SparseClassifier
from .distillation import Distillation, DistillationOutput
from .plain_model import PlainModel
from .regression import SparseLinearRegression, SparseLogisticRegression
from .sparse_model import SparseModel
from .teacher_cache import TeacherCache
from .top_k_kl import TopKLogits, top_k_kl_divergence, top_k_logits

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
    "TeacherCache",
    "TopKLogits",
    "top_k_kl_divergence",
    "top_k_logits",
]
