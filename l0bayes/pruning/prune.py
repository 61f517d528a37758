r"""Pruning: a gated network becomes a smaller dense one that computes the same function at test time.

At test time the paper uses the deterministic gate of Eq. 13,
:math:`\hat z = \min(1, \max(0, \sigma(\log\alpha)(\zeta - \gamma) + \gamma))`, and
:math:`\theta^* = \tilde\theta^* \odot \hat z`. :func:`prune` applies exactly that: groups with
:math:`\hat z = 0` are physically removed and the remaining (possibly fractional) :math:`\hat z`
are folded into the weights, so the dense model reproduces the gated model in ``eval()`` mode.

A network of L0 layers is walked as an ``nn.Sequential`` cut into segments (the tensor between two
weight layers, :mod:`l0bayes.pruning.sequential`). In a segment a unit (a feature map or a
feature) is dropped when

* it is exactly zero: an output map of an :class:`L0Conv2d` with :math:`\hat z_c = 0` (when every
  layer of the segment maps 0 to 0, as ReLU and max pooling do), or
* it is not used: an input neuron of an :class:`L0Linear` with :math:`\hat z_i = 0`; a producer
  unit is dropped when all the consumer inputs it feeds are closed (a conv map occupies the
  block of ``h * w`` columns ``c*h*w ... (c+1)*h*w - 1`` after flattening).

Network inputs and outputs are never dropped: where the first L0Linear closes some input
features, or where a conv map stays but some of its flattened columns are closed, a
parameter-free :class:`~l0bayes.pruning.SelectFeatures` (an ``index_select`` on dim 1) is inserted before the
consumer. A tensor always keeps at least one unit (zero-width convolutions do not run); such a
unit has zero weights when its group is closed.
"""

import copy
import warnings
from collections import OrderedDict

import torch
from torch import nn

from .._warnings import warn
from ..nn.layers import L0Conv2d, L0Linear
from ..threads import under_thread_policy
from .counting import count_parameters
from .dependency import prune_graph
from .select import SelectFeatures
from .sequential import LINEAR, PLAIN_CONV, WEIGHT, in_units, leaves, out_units, segments
from .size import test_time_density
from .sparsify import is_sparsified
from .transformer import is_transformer_gated, prune_transformer

__all__ = ["prune"]


def _ones(n, like, dtype=torch.bool):
    return torch.ones(n, dtype=dtype, device=like.device)


def _at_least_one(mask, within=None):
    """``mask``, or a mask with only the first unit of ``within`` (default: unit 0) when ``mask`` is empty."""
    if mask.any():
        return mask
    out = torch.zeros_like(mask)
    out[int(within.nonzero()[0]) if within is not None and within.any() else 0] = True
    return out


@torch.no_grad()
def _dense_copy(layer, keep_in, keep_out):
    """A plain ``nn.Linear`` / ``nn.Conv1d/2d/3d`` with the Eq. 13 gates folded in and the rows / columns kept."""
    weight, bias = layer.weight, layer.bias
    if isinstance(layer, L0Linear):
        weight = weight * layer.gate_values()  # gate i scales column i (Eq. 13: theta* = theta~ . z^)
    elif isinstance(layer, L0Conv2d):
        z = layer.gate_values()  # gate c scales the whole map c, bias included
        weight = weight * z[:, None, None, None]
        bias = bias * z if bias is not None else None
    weight = weight[keep_out][:, keep_in]
    factory = {"device": weight.device, "dtype": weight.dtype, "bias": bias is not None}
    with warnings.catch_warnings():  # zero-width linear layers: "Initializing zero-element tensors"
        warnings.simplefilter("ignore", UserWarning)
        if isinstance(layer, LINEAR):
            new = nn.utils.skip_init(nn.Linear, weight.shape[1], weight.shape[0], **factory)
        else:
            new = nn.utils.skip_init(
                nn.Conv2d if isinstance(layer, L0Conv2d) else next(c for c in PLAIN_CONV if isinstance(layer, c)),
                weight.shape[1],
                weight.shape[0],
                layer.kernel_size,
                stride=layer.stride,
                padding=layer.padding,
                dilation=layer.dilation,
                padding_mode=getattr(layer, "padding_mode", "zeros"),
                **factory,
            )
    new.weight.copy_(weight)
    if bias is not None:
        new.bias.copy_(bias[keep_out])
    return new


def _example_inputs(module, example_inputs):
    if example_inputs is None:
        example_inputs = getattr(module, "_l0_example_inputs", None)
    if example_inputs is None:
        raise ValueError("pruning a model of sparsify() needs example_inputs (a tensor the model accepts)")
    inputs = example_inputs if isinstance(example_inputs, tuple) else (example_inputs,)
    if not inputs or not all(torch.is_tensor(t) and t.dim() > 0 for t in inputs):
        raise TypeError(
            "prune: example_inputs must be a tensor with a batch dimension or a non-empty tuple of them (the model's "
            f"positional arguments), got {type(example_inputs).__name__}"
        )
    return inputs


def _warn_if_not_counted(gated, pruned):
    """Warn where the pruned model keeps another number of parameters than
    :func:`~l0bayes.pruning.test_time_density` counts (and so the FLOP fractions and a constrained objective's
    targets): a grouped convolution keeps as many channels in each of its groups, so the closed channels it reads stay
    where its groups close unequal numbers of them (:mod:`~l0bayes.pruning.dependency`); the sizes do not follow
    every layer that prune shrinks (a transposed convolution reading closed channels); a layer with every input
    closed keeps one."""
    if getattr(gated, "_l0_example_inputs", None) is None:  # sparsified without them: no sizes to compare with
        return
    counted = round(test_time_density(gated) * count_parameters(gated))
    kept = count_parameters(pruned)
    if kept != counted:
        warn(
            f"prune kept {kept:,} parameters where test_time_density counts {counted:,} (and so the FLOP fractions "
            "and a constrained objective's targets): closed channels a grouped convolution keeps so that its groups "
            "stay equal, a layer the sizes do not follow (such as a transposed convolution reading closed channels), "
            "or a layer whose every input closed make the two differ. The pruned model equals the gated one; count "
            "it with count_parameters(pruned)"
        )


@under_thread_policy
@torch.no_grad()
def prune(module, example_inputs=None):
    r"""A plain dense module equal to ``module`` in ``eval()`` mode, with closed groups removed.

    A model of :func:`~l0bayes.pruning.sparsify_transformer` loses its closed heads, MLP units and residual
    branches (:func:`~l0bayes.pruning.prune_transformer`).

    A model of :func:`~l0bayes.pruning.sparsify` (any architecture, residual connections and batch norm
    included) is pruned through its dependency graph: see :mod:`l0bayes.pruning.dependency` for what is
    removed. The result is the model's own class with smaller layers (and a
    :class:`~l0bayes.pruning.SelectFeatures` in front of a linear layer whose closed inputs stay in use elsewhere),
    without gates or hooks; it exports with :func:`torch.export.export`. ``example_inputs`` (a tensor
    or tuple of tensors the model accepts) defaults to the one given to :func:`~l0bayes.pruning.sparsify`.

    Otherwise ``module`` is an ``nn.Sequential`` of L0 layers (:class:`~l0bayes.nn.L0MLP`,
    :class:`~l0bayes.nn.L0LeNet5`, ...) and the result a plain ``nn.Sequential``:

    Input neurons and feature maps whose Eq. 13 gate is 0 are physically removed (smaller
    weight tensors), as are the producer units that only feed closed inputs (an output neuron of
    fc\ :sub:`k` closed by fc\ :sub:`k+1`'s input gate; a conv map whose flattened columns are all
    closed), the input channels of a convolution fed by closed maps, and the flattened columns
    of closed maps. The remaining Eq. 13 gate values, fractional ones included, are folded into
    the weights (``W[:, i] * z_i`` for :class:`L0Linear`, ``(W_c, b_c) * z_c`` for
    :class:`L0Conv2d`). Contains only ``nn.Linear``, ``nn.Conv2d``, copies of the other layers and
    :class:`~l0bayes.pruning.SelectFeatures`; returned in ``eval()`` mode. See the module docstring for the rules.

    Runs under :func:`~l0bayes.threads.thread_policy` (one intra-op thread unless you chose otherwise).
    """
    if is_transformer_gated(module):
        return prune_transformer(module, example_inputs)
    if is_sparsified(module):
        pruned = prune_graph(module, _example_inputs(module, example_inputs))
        _warn_if_not_counted(module, pruned)
        return pruned
    layers = leaves(module)
    keep_in, keep_out, selects = {}, {}, {}
    for seg in segments(layers):
        prod = layers[seg.producer][1] if seg.producer is not None else None
        cons = layers[seg.consumer][1] if seg.consumer is not None else None
        if prod is not None:
            keep = _ones(out_units(prod), prod.weight)
            if cons is not None:  # network outputs are never dropped
                if seg.zero_preserving and isinstance(prod, L0Conv2d):
                    keep &= prod.active_mask()
                if isinstance(cons, L0Linear):
                    keep &= cons.active_mask().view(-1, seg.hw).any(1)
                keep = _at_least_one(keep)
            keep_out[seg.producer] = keep
        if cons is not None:
            n = in_units(cons)
            available = keep_out[seg.producer].repeat_interleave(seg.hw) if prod is not None else _ones(n, cons.weight)
            need = cons.active_mask() if isinstance(cons, L0Linear) else _ones(n, cons.weight)
            keep = _at_least_one(available & need, within=available)
            keep_in[seg.consumer] = keep
            index = keep[available].nonzero().flatten()
            if index.numel() < int(available.sum()):
                selects[seg.consumer] = SelectFeatures(index, int(available.sum()))
    out = OrderedDict()
    for i, (name, leaf) in enumerate(layers):
        if i in selects:
            out[f"select_{name}"] = selects[i]
        out[name] = _dense_copy(leaf, keep_in[i], keep_out[i]) if isinstance(leaf, WEIGHT) else copy.deepcopy(leaf)
    return nn.Sequential(out).eval()
