"""Pruning: gates on any network, the smaller network they leave, its size and its safe export.

* :func:`sparsify` attaches hard concrete gates to an existing model (:func:`l0_wide_resnet`: the paper's
  Wide ResNet); :func:`strip_gates` folds the test-time gates back into its weights.
* :func:`prune` removes the closed groups: along an ``nn.Sequential`` of L0 layers
  (:mod:`~l0bayes.pruning.sequential`), or through the dependency graph of a sparsified model
  (:mod:`~l0bayes.pruning.dependency`), residual connections included.
* :func:`sparsify_transformer`: gates on a transformer's attention heads, MLP units and residual branches
  (:mod:`~l0bayes.pruning.transformer`), which :func:`prune` removes and :class:`TransformerSize` counts.
* :func:`count_parameters`, :func:`flops` and :class:`PruneReport`: the sizes of Table 1 and Fig. 3;
  :class:`NetworkSize`, :func:`expected_density`, :func:`test_time_density`, :func:`expected_flops`,
  :func:`expected_flops_fraction` and :func:`test_time_flops_fraction`: what the pruned model keeps,
  counted as :func:`prune` removes (:mod:`~l0bayes.pruning.size`), in expectation under :math:`q` and at test time.
* :func:`importance_scores`: first-order Taylor or activation (Wanda-style) scores of every gate from calibration
  batches; :func:`init_from_importance` starts the gates from them, at the cut and the expected size of a
  constrained objective's target (:mod:`~l0bayes.pruning.importance`).
* :func:`save_pruned` / :func:`load_pruned`: a pruned network as tensors and a list of layers, loaded
  without running code (:mod:`~l0bayes.pruning.export`; the list: :mod:`~l0bayes.pruning.describe`);
  :func:`for_inference` prepares it for CPU inference (:mod:`~l0bayes.pruning.folding`).
"""

from .counting import count_parameters, flops
from .export import load_pruned, save_pruned
from .folding import fold_batch_norm, for_inference
from .importance import IMPORTANCE_KINDS, importance_scores, init_from_importance
from .prune import prune
from .report import PruneReport
from .select import SelectFeatures
from .size import (
    NetworkSize,
    expected_density,
    expected_flops,
    expected_flops_fraction,
    network_size,
    test_time_density,
    test_time_flops_fraction,
)
from .sparsify import GatedLayer, Group, GroupGate, sparsify, strip_gates
from .transformer import (
    Block,
    BlockGate,
    HeadGate,
    LayerGate,
    PrunedMultiheadAttention,
    PrunedTransformerEncoderLayer,
    TargetArchitecture,
    TransformerSize,
    UnitGate,
    ZeroBranch,
    fix_architecture,
    flops_per_token,
    prune_transformer,
    sparsify_transformer,
)
from .wrn import l0_wide_resnet

__all__ = [
    "Block",
    "BlockGate",
    "GatedLayer",
    "Group",
    "GroupGate",
    "IMPORTANCE_KINDS",
    "NetworkSize",
    "PruneReport",
    "SelectFeatures",
    "HeadGate",
    "LayerGate",
    "PrunedMultiheadAttention",
    "PrunedTransformerEncoderLayer",
    "TargetArchitecture",
    "TransformerSize",
    "UnitGate",
    "ZeroBranch",
    "count_parameters",
    "expected_density",
    "expected_flops",
    "expected_flops_fraction",
    "flops",
    "flops_per_token",
    "fold_batch_norm",
    "for_inference",
    "importance_scores",
    "init_from_importance",
    "l0_wide_resnet",
    "load_pruned",
    "network_size",
    "prune",
    "fix_architecture",
    "prune_transformer",
    "save_pruned",
    "sparsify",
    "sparsify_transformer",
    "strip_gates",
    "test_time_density",
    "test_time_flops_fraction",
]
