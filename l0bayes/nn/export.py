"""The former home of :mod:`l0bayes.pruning.export`: these names still import from here."""

from ..pruning.export import (
    LAYER_TYPES,
    build_into,
    build_pruned,
    describe_modules,
    describe_pruned,
    fold_batch_norm,
    for_inference,
    load_pruned,
    save_pruned,
)

__all__ = [
    "LAYER_TYPES",
    "build_into",
    "build_pruned",
    "describe_modules",
    "describe_pruned",
    "fold_batch_norm",
    "for_inference",
    "load_pruned",
    "save_pruned",
]
