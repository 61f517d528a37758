"""Removing what the gates close: :func:`prune_transformer`."""

import copy
import dataclasses

import torch
from torch import nn

from ..._warnings import warn
from ..hooks import as_input_tuple, remove_hooks
from .attach import check_example_inputs, is_transformer_gated
from .attention import PrunedMultiheadAttention, PrunedTransformerEncoderLayer, ZeroBranch
from .blocks import _attentions, _set
from .equality import block_budget, check_equal, gated_reference
from .gates import _TransformerGate
from .hf_config import update_config
from .projections import features, like
from .projections import weight as projection_weight


def _keep(z):
    """The heads / units to keep: open Eq. 13 gates, and at least one (the first) where all are closed."""
    keep = z > 0
    if not keep.any():
        keep[0] = True
    return keep


def _gate_value(block, key):
    holder = getattr(block, key, None)
    return None if holder is None else holder.gate.deterministic()


def _branch_value(block, key):
    """The Eq. 13 value a branch's output is multiplied by: its own gate times the block's (``None``: neither)."""
    z, z_block = _gate_value(block, key), _gate_value(block, "l0_block")
    if z_block is None:
        return z
    return z_block if z is None else z * z_block


def _closed(block, r):
    """Whether every branch of block ``r`` is closed (then the block computes the identity, if it is removable)."""
    keys = [att.branch_key for att in _attentions(r)] + ["l0_mlp"]
    values = [_branch_value(block, key) for key in keys]
    return all(v is not None and float(v) == 0.0 for v in values)


def _close_attention(plain, r, att):
    """Replace a closed attention branch by :class:`ZeroBranch` es."""
    pair = r.outputs == 2 or isinstance(att, nn.MultiheadAttention)
    if r.branch_output == "projection":
        n_in, n_out = features(plain.get_submodule(r.out))
        _set(plain, r.heads_owner, ZeroBranch(pair=pair, features=n_in))
        _set(plain, r.out, ZeroBranch(features=n_out))
    else:
        _set(plain, r.attention, ZeroBranch(pair=pair, batch_first=getattr(att, "batch_first", False)))


@torch.no_grad()
def _prune_attention(plain, r, block):
    """Replace the attention of block ``r`` by its kept heads (Eq. 13 values folded), or a :class:`ZeroBranch`."""
    z_layer = _branch_value(block, r.branch_key)
    att = plain.get_submodule(r.attention)
    if z_layer is not None and float(z_layer) == 0.0:
        _close_attention(plain, r, att)
        return
    z_heads = _gate_value(block, r.heads_key)
    h, d, g = r.num_heads, r.head_dim, r.groups
    out = plain.get_submodule(r.out)
    w_out = projection_weight(out)
    z_heads = torch.ones(g, device=w_out.device, dtype=w_out.dtype) if z_heads is None else z_heads
    keep = _keep(z_heads)
    kept = int(keep.sum())  # key-value groups (heads without grouped-query attention)
    rows = keep.repeat_interleave(r.q_width)
    scale = z_heads.to(w_out.dtype).repeat_interleave(r.q_width)[rows]
    z = 1.0 if z_layer is None else z_layer.to(w_out.dtype)
    out_weight = w_out[:, rows] * scale * z
    out_bias = None if out.bias is None else out.bias * z
    if r.kind == "linear":
        kv_rows = keep.repeat_interleave(d)
        if r.fused:
            select = keep.repeat_interleave(3 * d) if r.qkv_layout == "per_head" else rows.repeat(3)
            selects = {r.q: select}
        else:
            selects = {r.q: rows, r.k: kv_rows, r.v: kv_rows}
        for name, select in selects.items():
            m = plain.get_submodule(name)
            _set(plain, name, like(m, projection_weight(m)[select], None if m.bias is None else m.bias[select]))
        _set(plain, r.out, like(out, out_weight, out_bias))
        owner = plain.get_submodule(r.heads_owner)
        heads = kept * (h // g)
        if r.heads_attr is not None:
            setattr(owner, r.heads_attr, heads)
        for attr in ("all_head_size", "split_size", "inner_dim"):  # widths some attentions split or reshape by
            if getattr(owner, attr, None) == h * d and isinstance(getattr(owner, attr), int):
                setattr(owner, attr, heads * d)
        if r.kv_heads and isinstance(getattr(owner, "num_key_value_heads", None), int):
            owner.num_key_value_heads = kept
        return
    e = att.embed_dim
    if att._qkv_same_embed_dim:
        w = att.in_proj_weight
        weights = (w[:e], w[e : 2 * e], w[2 * e :])
    else:
        weights = (att.q_proj_weight, att.k_proj_weight, att.v_proj_weight)
    b = att.in_proj_bias
    biases = (None, None, None) if b is None else (b[:e], b[e : 2 * e], b[2 * e :])
    new = PrunedMultiheadAttention(
        e, kept, d, att.kdim, att.vdim, bias=b is not None, batch_first=att.batch_first, dropout=att.dropout
    ).to(device=w_out.device, dtype=w_out.dtype)
    for proj, w_, b_ in zip((new.q_proj, new.k_proj, new.v_proj), weights, biases, strict=True):
        proj.weight.copy_(w_[rows])
        if b_ is not None:
            proj.bias.copy_(b_[rows])
    new.out_proj = like(out, out_weight, out_bias)
    _set(plain, r.attention, new)


@torch.no_grad()
def _prune_mlp(plain, r, block):
    """Remove the closed units of block ``r``'s MLP (Eq. 13 values folded), or the whole branch. ``False``: gone."""
    z_layer = _branch_value(block, "l0_mlp")
    down = plain.get_submodule(r.down)
    if z_layer is not None and float(z_layer) == 0.0:
        if r.mlp_at_projection:
            for name in r.up:
                _set(plain, name, ZeroBranch(features=1))
            _set(plain, r.down, ZeroBranch(features=features(down)[1]))
        elif r.kind != "encoder":
            _set(plain, r.mlp, ZeroBranch())
        return False
    w_down = projection_weight(down)
    z_units = _gate_value(block, "l0_units")
    if z_units is None:
        z_units = torch.ones(w_down.shape[1], device=w_down.device, dtype=w_down.dtype)
    keep = _keep(z_units)
    z = 1.0 if z_layer is None else z_layer.to(w_down.dtype)
    for name in r.up:
        m = plain.get_submodule(name)
        _set(plain, name, like(m, projection_weight(m)[keep], None if m.bias is None else m.bias[keep]))
    weight = w_down[:, keep] * z_units.to(w_down.dtype)[keep] * z
    _set(plain, r.down, like(down, weight, None if down.bias is None else down.bias * z))
    return True


def _strip_hooks(plain):
    """Remove every hook of the transformer gates, from every module."""
    holders = [m for m in plain.modules() if isinstance(m, _TransformerGate)]
    for m in plain.modules():
        for holder in holders:
            remove_hooks(m, holder)


@torch.no_grad()
def prune_transformer(model, example_inputs=None):
    r"""A plain module equal to the gated ``model`` in ``eval()`` mode, without its closed heads, units and branches.

    For every gated block, with the Eq. 13 gates :math:`\hat z`: the rows of :math:`W_Q, W_K, W_V` (and biases)
    and the columns of :math:`W_O` of the closed heads are removed (their q, k and v outputs of a fused
    projection such as GPT-2's ``c_attn``; a Hugging Face ``Conv1D`` stays a ``Conv1D``), and the attention's
    head count attribute lowered, with ``all_head_size`` and ``split_size`` where it has them (an
    ``nn.MultiheadAttention`` becomes a :class:`PrunedMultiheadAttention`); the rows and biases of the MLP's
    first layer(s) and the columns of its second layer of the closed units are removed; a closed branch becomes a
    :class:`ZeroBranch` (with ``branch_output="projection"`` or an MLP without a module of its own, its layers
    do; in an ``nn.TransformerEncoderLayer``, which becomes a :class:`PrunedTransformerEncoderLayer`, the branch
    is dropped). A block keeps at least one head and one unit.
    The open gates' values are folded into the output projection's columns, the second MLP layer's columns and
    each branch's last layer.

    The result is checked against the gated model on ``example_inputs`` (default: those given to
    :func:`sparsify_transformer`) in float64: the gated model runs on them first, and a ``ValueError`` naming
    ``example_inputs`` says where it does not (float token ids, ids beyond the vocabulary); a ``ValueError`` says
    when the pruned model does not run after the gated one did, or differs from it (the attention's forward does
    not follow the lowered head count). Each module is cast to float64 only while it runs (a block at a time),
    so the check takes about one block's float64 copy beyond the two models, not a copy of the whole model.

    A Hugging Face model (or one inside your own module) gets a config of its kept sizes where its config class
    can describe them (see :mod:`~l0bayes.pruning.transformer.hf_config`); otherwise it keeps its config, ``prune``
    warns, and its ``save_pretrained`` raises a ``ValueError`` saying what that config can describe (save it
    with :func:`~l0bayes.pruning.save_pruned`). The quantization marks of a model loaded from a GGUF file
    (whose weights transformers dequantized into plain tensors) are removed from the pruned model, whose weights
    are plain tensors, so that it saves.
    """
    if not is_transformer_gated(model):
        raise ValueError("prune_transformer needs a model of sparsify_transformer()")
    if example_inputs is None:
        example_inputs = as_input_tuple(model._l0_example_inputs)
    else:
        example_inputs = check_example_inputs(example_inputs)
    budget = block_budget(model, model._l0_transformer)
    # first: a failure here is example_inputs' fault
    probe, reference, budget = gated_reference(model, example_inputs, budget)
    plain = copy.deepcopy(model).eval()
    _strip_hooks(plain)
    resolved = plain._l0_transformer
    may_remove_all = getattr(plain, "_l0_may_remove_all", True)
    for attr in ("_l0_transformer", "_l0_example_inputs", "_l0_may_remove_all"):
        if attr in plain.__dict__:
            object.__delattr__(plain, attr)
    if not may_remove_all:
        _warn_if_all_closed(plain, resolved)
    removed = []
    for r in resolved:
        block = plain.get_submodule(r.name)
        if r.removable and _closed(block, r):
            removed.append(r)
        for att in _attentions(r):
            _prune_attention(plain, att, block)
        feed_forward = _prune_mlp(plain, r, block)
        keys = ("l0_heads", "l0_units", "l0_attention", "l0_mlp", "l0_cross_heads", "l0_cross_attention", "l0_block")
        for key in keys:
            if hasattr(block, key):
                delattr(block, key)
        if r.kind == "encoder":
            _set(plain, r.name, PrunedTransformerEncoderLayer(block, block.self_attn, feed_forward))
    kept, positions = _remove_blocks(plain, resolved, removed)
    update_config(plain, kept, positions)
    check_equal(model, plain, probe, reference, budget)
    return plain.eval()


def _remove_blocks(plain, resolved, removed):
    """Delete the ``removed`` blocks from their ``nn.ModuleList`` (or ``nn.Sequential``); renumber the ``layer_idx``
    of the later blocks' modules (Hugging Face's key-value cache is indexed by it). Returns the kept blocks under
    their new names, and ``{list name: (the kept entries' former positions, the former length)}`` of the lists that
    lost blocks."""
    gone = {r.name for r in removed}
    renames, positions = {}, {}
    for parent in sorted({r.name.rpartition(".")[0] for r in removed}):  # (a removable block is a list's entry)
        container = plain.get_submodule(parent)
        before = len(container)
        drop = [i for i in range(before) if f"{parent}.{i}" in gone]
        for i in reversed(drop):
            del container[i]
        kept = [i for i in range(before) if i not in drop]
        positions[parent] = (kept, before)
        for new, old in enumerate(kept):
            renames[f"{parent}.{old}"] = f"{parent}.{new}"
            for m in container[new].modules():
                value = getattr(m, "layer_idx", None)
                if isinstance(value, int) and not isinstance(value, bool) and value == old:
                    m.layer_idx = new
    kept = [_renamed(r, renames) for r in resolved if r.name not in gone]
    return kept, positions


def _renamed(r, renames):
    """``r`` with its block's prefix changed as ``renames`` says (a block that moved up its list)."""
    new = renames.get(r.name)
    if new is None or new == r.name:
        return r

    def move(name):
        if isinstance(name, str) and (name == r.name or name.startswith(r.name + ".")):
            return new + name[len(r.name) :]
        return name

    fields = {f.name: getattr(r, f.name) for f in dataclasses.fields(r)}
    fields = {k: [move(n) for n in v] if isinstance(v, list) else move(v) for k, v in fields.items()}
    if r.cross is not None:
        fields["cross"] = _renamed(r.cross, {r.name: new})
    return dataclasses.replace(r, **fields)


def _warn_if_all_closed(plain, resolved):
    """A loud warning when the Eq. 13 gates close the attention (or MLP) branch of every gated block."""
    kinds = {"attention": [], "MLP": [], "cross-attention": []}
    for r in resolved:
        block = plain.get_submodule(r.name)
        for kind, key in (("attention", r.branch_key), ("MLP", "l0_mlp")):
            kinds[kind].append(_branch_value(block, key))
        if r.cross is not None:
            kinds["cross-attention"].append(_branch_value(block, r.cross.branch_key))
    for kind, values in kinds.items():
        if values and all(v is not None and float(v) == 0.0 for v in values):
            warn(
                f"the gates close the {kind} branch of every block ({len(values)}): the pruned model has no "
                f"{kind} at all. If this is what you want, gate with sparsify_transformer(..., may_remove_all=True); "
                "otherwise give a target the model can reach, or more epochs before the final phase"
            )


#: The ``log_alpha`` of a gate fixed open (Eq. 13 gate exactly 1) or closed (exactly 0).
FIXED_LOG_ALPHA = 50.0


@torch.no_grad()
def fix_architecture(
    model, num_attention_heads=None, num_key_value_heads=None, intermediate_size=None, num_hidden_layers=None
):
    r"""Fix the gates of a model of :func:`sparsify_transformer` to one architecture, the same in every block.

    In every gated block the best-ranked (largest ``log_alpha``) key-value groups (heads, without grouped-query
    attention) and MLP units stay open, with Eq. 13 gate exactly 1, and the others are closed; the branch gates
    are opened; with ``num_hidden_layers``, the best-ranked block gates stay open and the other blocks close
    (``prune`` removes them). :func:`~l0bayes.pruning.prune` then returns a model with exactly these sizes in every
    block (of the same Hugging Face class with an updated config, which ``save_pretrained`` / ``from_pretrained``
    rebuild). A head or unit size left ``None`` keeps its gates as they are (give all of them for a uniform
    result); ``num_hidden_layers=None`` opens every block gate.

    :param num_attention_heads: query heads per block: a multiple of the query heads per key-value group.
    :param num_key_value_heads: key-value heads per block (with grouped-query attention; it must agree with
        ``num_attention_heads`` when both are given).
    :param intermediate_size: MLP units per block.
    :param num_hidden_layers: blocks kept (needs ``sparsify_transformer(..., depth=True)``).
    :returns: ``model``, its gates fixed (in place).
    """
    from .target import TargetArchitecture

    if not is_transformer_gated(model):
        raise ValueError("fix_architecture needs a model of sparsify_transformer()")
    sizes = {
        "num_attention_heads": num_attention_heads,
        "num_key_value_heads": num_key_value_heads,
        "intermediate_size": intermediate_size,
        "num_hidden_layers": num_hidden_layers,
    }
    for key, value in sizes.items():
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value <= 0):
            raise ValueError(f"{key} must be a positive int, got {value!r}")
    choices = TargetArchitecture(**sizes).choices(model)
    for choice in choices:
        if choice.k is None and choice.kind in ("heads", "units"):
            continue  # a size not named: its gates as they are
        scores = [h.gate.log_alpha.detach() for h in choice.holders]
        for holder, keep in zip(choice.holders, choice.masks(scores), strict=True):
            fixed = torch.full_like(holder.gate.log_alpha, -FIXED_LOG_ALPHA)
            holder.gate.log_alpha.copy_(fixed.masked_fill_(keep, FIXED_LOG_ALPHA))
    return model
