r"""Structured gates on transformers: attention heads, MLP units and whole residual branches.

:func:`sparsify_transformer` attaches hard concrete gates (Louizos, Welling & Kingma 2018, Eq. 10-13) to
the structures a transformer is pruned by, in the spirit of CoFi (Xia, Zhong & Chen, ACL 2022) and
Sheared-LLaMA (Xia et al., 2024):

* **heads**: one gate per attention head, multiplying the head's output (its slice of the input of the
  output projection) before the output projection, :math:`o = \big(\bigoplus_h z_h\, \mathrm{head}_h\big)
  W_O^\top + b_O`. A closed head removes its rows of :math:`W_Q, W_K, W_V` (and their biases) and its
  columns of :math:`W_O`;
* **units**: one gate per intermediate unit of the MLP, on the input of its second linear layer (as
  :func:`~l0bayes.pruning.sparsify` gates a linear layer's inputs). A closed unit removes the column of the
  second layer and the row and bias of the first (of every first layer, for a gated linear unit);
* **layers**: one scalar gate per residual branch (the attention branch and the MLP branch of a block),
  multiplying the branch's output, :math:`x + z\, f(x)`. A closed branch is removed;
* **blocks** (``depth=True``): one scalar gate per block (Sheared-LLaMA's layer mask), multiplying the outputs
  of all its branches. A block whose branches are all closed (by their own gates or by the block gate) is
  removed from its ``nn.ModuleList`` when it is then the identity (a pre-norm block), with its normalisation
  layers: they count as :math:`c_n\, z_b \big(1 - \prod_i (1 - z_i)\big)` over its branch gates :math:`z_i`.

Each gate is drawn once per forward pass of the model (one draw per minibatch, as in the paper); in
``eval()`` mode the Eq. 13 gate is used. :func:`prune_transformer` (called by
:func:`~l0bayes.pruning.prune`) removes what the Eq. 13 gates close and folds their fractional values into
the weights (:math:`\theta^* = \tilde\theta \odot \hat z`), so the result equals the gated model in
``eval()`` mode; it is plain torch and exports with :func:`torch.export.export`.

:class:`TransformerSize` counts what the pruned model keeps, exactly (0/1 gates: equal to
:func:`~l0bayes.pruning.count_parameters` of :func:`~l0bayes.pruning.prune`'s result) and in expectation
under :math:`q` (every gate replaced by :math:`q(z \ne 0)`, Eq. 12: differentiable). With :math:`n_h` the
number of kept heads of a block, :math:`n_u` its kept units and :math:`z_a, z_m` its branch gates,

.. math::

    |\theta_{\text{kept}}| = c + \sum_{\text{blocks}} z_a\,(c_a + p_h\, n_h) + z_m\,(c_m + p_u\, n_u),

with :math:`p_h` the parameters of one head (its rows of :math:`W_Q, W_K, W_V` and biases, its columns of
:math:`W_O`), :math:`p_u` those of one unit, :math:`c_a, c_m` the branch's parameters no head or unit gate
touches and :math:`c` the rest of the network. The gates of each product are independent under
:math:`q`, so the expectation is the same formula with :math:`q(z \ne 0)` for every :math:`z` and
:math:`\sum_h q(z_h \ne 0)` for :math:`n_h` (the exact count keeps at least one head and one unit, as
:func:`~l0bayes.pruning.prune` does; the expectation leaves that rule out). The FLOPs per token are the
same kind of sum, counted as :func:`~l0bayes.pruning.flops` counts: the linear layers, ``2 * in * out + out``
per token (the attention's score and weighted-sum products are not counted).
"""

from .attach import is_transformer_gated, sparsify_transformer
from .attention import PrunedMultiheadAttention, PrunedTransformerEncoderLayer, ZeroBranch
from .blocks import (
    ATTENTION_NAMES,
    DOWN_NAMES,
    HEADS_ATTRS,
    K_NAMES,
    MLP_NAMES,
    OUT_NAMES,
    POST_NORM_LAYOUT,
    Q_NAMES,
    QKV_NAMES,
    UP_NAMES,
    V_NAMES,
    Block,
)
from .gates import BlockGate, HeadGate, LayerGate, UnitGate
from .prune import fix_architecture, prune_transformer
from .size import TransformerSize, flops_per_token
from .target import TargetArchitecture

__all__ = [
    "ATTENTION_NAMES",
    "DOWN_NAMES",
    "HEADS_ATTRS",
    "K_NAMES",
    "MLP_NAMES",
    "OUT_NAMES",
    "POST_NORM_LAYOUT",
    "Q_NAMES",
    "QKV_NAMES",
    "UP_NAMES",
    "V_NAMES",
    "Block",
    "BlockGate",
    "HeadGate",
    "LayerGate",
    "PrunedMultiheadAttention",
    "PrunedTransformerEncoderLayer",
    "TargetArchitecture",
    "TransformerSize",
    "UnitGate",
    "ZeroBranch",
    "fix_architecture",
    "flops_per_token",
    "is_transformer_gated",
    "prune_transformer",
    "sparsify_transformer",
]
