"""Attaching head, unit and branch gates to a transformer: :func:`sparsify_transformer`."""

import copy

import torch
from torch import nn

from ..sparsify import _as_tuple, _probe_forward, is_sparsified
from .attention import _ExplicitMultiheadAttention, _GatedTransformerEncoderLayer
from .blocks import (
    _attention_modules,
    _attentions,
    _auto_blocks,
    _head_groups,
    _mlp_modules,
    _own_parameters,
    _resolve,
    _unit_groups,
)
from .gates import HeadGate, LayerGate, UnitGate
from .projections import features


def sparsify_transformer(
    model, blocks=None, *, example_inputs, heads=True, units=True, layers=True, inplace=False, **gate_kwargs
):
    r"""Attach head, unit and branch gates to the blocks of a transformer; returns the gated model.

    :param model: any :class:`torch.nn.Module` holding transformer blocks.
    :param blocks: the blocks to gate: a list of names or :class:`Block` s. Default: every
        ``nn.TransformerEncoderLayer``, every BERT-style layer (:data:`POST_NORM_LAYOUT`) and every module with an
        attention and an MLP child of a default name (:data:`ATTENTION_NAMES`, :data:`MLP_NAMES`), which covers
        Hugging Face's GPT-2 blocks.
    :param example_inputs: a tensor (or tuple) the model accepts, e.g. a batch of token ids; kept on the model
        for :func:`~l0bayes.pruning.prune` (which checks the pruned model against the gated one on it) and for
        the counts of :class:`TransformerSize` (FLOPs per token).
    :param bool heads: attach a :class:`HeadGate` ``l0_heads`` to every block.
    :param bool units: attach a :class:`UnitGate` ``l0_units`` to every block.
    :param bool layers: attach :class:`LayerGate` s ``l0_attention`` and ``l0_mlp`` to every block.
    :param inplace: modify ``model`` itself instead of a deep copy.
    :param gate_kwargs: ``init_drop_rate``, ``temperature``, ``lower``, ``upper``, ``init_std`` of every gate.
    :returns: the gated model, in the training mode ``model`` was in; its gates are listed by
        :func:`~l0bayes.nn.gates_of` as ``"<block>.l0_heads.gate"``, ``"<block>.l0_units.gate"``, ...
    """
    if not (heads or units or layers):
        raise ValueError("heads, units and layers are all False: nothing to gate")
    if example_inputs is None:
        raise ValueError("sparsify_transformer needs example_inputs (a batch the model accepts)")
    if is_sparsified(model) or is_transformer_gated(model):
        raise ValueError("the model already has gates")
    if not inplace:
        model = copy.deepcopy(model)
    names = _auto_blocks(model) if blocks is None else list(blocks)
    if not names:
        raise ValueError("no transformer block found; name them with blocks=[...]")
    resolved = [_resolve(model, b) for b in names]
    seen = set()
    for r in resolved:
        if r.name in seen:
            raise ValueError(f"block {r.name!r} named twice")
        seen.add(r.name)
    if layers:
        _probe_outputs(model, resolved, _as_tuple(example_inputs))
    for r in resolved:
        _attach_block(model, r, heads, units, layers, gate_kwargs)
    for m in model.modules():  # the nested-tensor fast path would skip the gates
        if isinstance(m, nn.TransformerEncoder):
            m.use_nested_tensor = False
    object.__setattr__(model, "_l0_transformer", resolved)
    object.__setattr__(model, "_l0_example_inputs", tuple(t[:1].detach().clone() for t in _as_tuple(example_inputs)))
    return model


def _probe_outputs(model, resolved, inputs):
    """Fill in each block's ``outputs`` (what a :class:`ZeroBranch` in its attention's place must return) by one
    forward pass; a ``ValueError`` where a gated module's output is neither a tensor nor a ``(tensor, ...)`` pair."""
    seen = {}

    def hook(name):
        def record(module, args, output):
            seen[name] = output

        return record

    watched = {}
    for r in resolved:
        if r.kind == "encoder":
            continue
        owner = r.heads_owner if r.branch_output == "projection" else r.attention
        watched[owner] = r
    handles = [model.get_submodule(n).register_forward_hook(hook(n)) for n in watched]
    _probe_forward(model, inputs, handles)
    for name, r in watched.items():
        output = seen.get(name)
        if torch.is_tensor(output):
            r.outputs = 0
        elif isinstance(output, tuple) and len(output) == 2 and torch.is_tensor(output[0]):
            r.outputs = 2
        else:
            what = "not called" if name not in seen else f"a {type(output).__name__}"
            raise ValueError(
                f"{name}: branch gates need the attention's output to be a tensor or a (tensor, weights) pair; on "
                f"example_inputs it was {what} (layers=False gates heads and units only)"
            )


def _attach_block(model, r, heads, units, layers, gate_kwargs):
    """The gates of one block, in the order heads, units, attention branch, MLP branch (then a decoder layer's
    cross-attention heads and branch): the order of :func:`~l0bayes.nn.gates_of`."""
    block = model.get_submodule(r.name)
    if r.kind == "encoder":
        block.__class__ = _GatedTransformerEncoderLayer
    for att in _attentions(r):
        if att.kind in ("encoder", "mha"):
            model.get_submodule(att.attention).__class__ = _ExplicitMultiheadAttention
    if heads:
        _attach_heads(model, block, r, gate_kwargs)
    if units:
        groups, per_unit = _unit_groups(model, r)
        down = model.get_submodule(r.down)
        holder = UnitGate(features(down)[0], per_unit, **gate_kwargs)
        holder._groups = groups
        block.l0_units = holder
        down.register_forward_pre_hook(holder._gate_units)
    if layers:
        _attach_attention_branch(model, block, r, gate_kwargs)
        hooked = r.down if r.mlp_at_projection else r.mlp
        _attach_branch(model, block, "l0_mlp", _mlp_modules(model, r), hooked, r.kind, gate_kwargs)
    if r.cross is not None:
        if heads:
            _attach_heads(model, block, r.cross, gate_kwargs)
        if layers:
            _attach_attention_branch(model, block, r.cross, gate_kwargs)


def _attach_heads(model, block, r, gate_kwargs):
    groups, per_head = _head_groups(model, r)
    holder = HeadGate(r.num_heads, r.head_dim, per_head, **gate_kwargs)
    holder._groups = groups
    setattr(block, r.heads_key, holder)
    model.get_submodule(r.out).register_forward_pre_hook(holder._gate_heads)


def _attach_attention_branch(model, block, r, gate_kwargs):
    hooked = r.out if r.branch_output == "projection" else r.attention
    _attach_branch(model, block, r.branch_key, _attention_modules(model, r), hooked, r.kind, gate_kwargs)


def _attach_branch(model, block, key, modules, hooked, kind, gate_kwargs):
    holder = LayerGate(1, max(1, _own_parameters(modules)), **gate_kwargs)
    holder._groups = [(m, n, 0, 0) for m in modules for n, _ in m.named_parameters()]
    setattr(block, key, holder)
    if kind != "encoder":  # the encoder layer's forward calls its branch gates itself
        model.get_submodule(hooked).register_forward_hook(holder._gate_output)


def is_transformer_gated(module):
    """Whether ``module`` holds gates attached by :func:`sparsify_transformer`."""
    return getattr(module, "_l0_transformer", None) is not None
