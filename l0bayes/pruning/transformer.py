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
  multiplying the branch's output, :math:`x + z\, f(x)`. A closed branch is removed.

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

import copy
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..nn.density import density_names
from ..nn.gates import HardConcreteGate, gate_owners
from ..nn.layers import L0Layer
from .counting import count_parameters
from .sparsify import _as_tuple, _probe_forward, _remove_hooks, is_sparsified

__all__ = [
    "Block",
    "HeadGate",
    "LayerGate",
    "PrunedMultiheadAttention",
    "PrunedTransformerEncoderLayer",
    "TransformerSize",
    "UnitGate",
    "ZeroBranch",
    "flops_per_token",
    "is_transformer_gated",
    "prune_transformer",
    "sparsify_transformer",
]

#: Default names, searched in this order, of a block's attention module, its projections and head count,
#: and of its MLP module and layers.
ATTENTION_NAMES = ("attn", "attention", "self_attn", "self_attention", "mha")
Q_NAMES = ("q_proj", "query", "q", "wq", "q_lin")
K_NAMES = ("k_proj", "key", "k", "wk", "k_lin")
V_NAMES = ("v_proj", "value", "v", "wv", "v_lin")
OUT_NAMES = ("out_proj", "o_proj", "out", "proj", "c_proj", "wo", "dense", "out_lin")
HEADS_ATTRS = ("num_heads", "n_head", "n_heads", "num_attention_heads", "heads")
MLP_NAMES = ("mlp", "ffn", "feed_forward", "ff", "ffwd")
UP_NAMES = ("fc1", "c_fc", "gate_proj", "up_proj", "w1", "w3", "lin1", "fc_in", "linear1")
DOWN_NAMES = ("fc2", "c_proj", "down_proj", "w2", "lin2", "fc_out", "linear2", "proj")


@dataclass
class Block:
    """One transformer block to gate: the ``blocks`` argument of :func:`sparsify_transformer`.

    Names are relative: ``attention`` and ``mlp`` to the block, the projections to the attention module,
    ``up`` and ``down`` to the MLP module. ``None`` searches the defaults (:data:`ATTENTION_NAMES`,
    :data:`Q_NAMES`, ...). An ``nn.TransformerEncoderLayer`` needs only its ``name``.

    :param name: the block (qualified name as in :meth:`torch.nn.Module.named_modules`).
    :param attention: the attention module: an ``nn.MultiheadAttention``, or a module with ``q``, ``k``,
        ``v`` and ``out`` ``nn.Linear`` layers whose forward splits the projections into ``num_heads`` heads
        of ``q.out_features / num_heads`` features each (head-major, as GPT-2 and BERT do) and reads the head
        count from the attribute ``heads_attr`` (which :func:`prune_transformer` lowers). Its output is the
        attention branch (what the block adds to the residual stream).
    :param num_heads: the number of heads; default: the attention module's ``heads_attr``.
    :param mlp: the MLP module; its output is the MLP branch. Its ``up`` layers (one, or several read
        element-wise together, as a gated linear unit) feed, through element-wise operations, its ``down``
        layer.
    """

    name: str
    attention: str | None = None
    q: str | None = None
    k: str | None = None
    v: str | None = None
    out: str | None = None
    num_heads: int | None = None
    heads_attr: str | None = None
    mlp: str | None = None
    up: str | list | None = None
    down: str | None = None


@dataclass
class _Resolved:
    """A :class:`Block` with absolute names, its kind (``"encoder"``, ``"linear"``, ``"mha"``) and head shapes."""

    name: str
    kind: str
    attention: str
    q: str | None
    k: str | None
    v: str | None
    out: str
    num_heads: int
    head_dim: int
    heads_attr: str | None
    mlp: str | None
    up: list
    down: str


def _join(*parts):
    return ".".join(p for p in parts if p)


def _first(module, names, what, where):
    for n in names:
        if isinstance(getattr(module, n, None), nn.Module):
            return n
    raise ValueError(f"{where}: no {what} among the default names {list(names)}; name it in Block(...)")


def _linear(model, name, what):
    try:
        m = model.get_submodule(name)
    except AttributeError:
        raise ValueError(f"{what}: no module named {name!r} in the model") from None
    if not isinstance(m, nn.Linear):
        raise TypeError(f"{what} {name!r} must be an nn.Linear, got {type(m).__name__}")
    return m


def _resolve(model, block):
    """The :class:`_Resolved` of one block (a name or a :class:`Block`); ValueErrors naming what is missing."""
    block = Block(block) if isinstance(block, str) else block
    try:
        module = model.get_submodule(block.name)
    except AttributeError:
        raise ValueError(f"blocks: no module named {block.name!r} in the model") from None
    if isinstance(module, nn.TransformerDecoderLayer):
        raise NotImplementedError(f"{block.name}: nn.TransformerDecoderLayer is not supported yet")
    if isinstance(module, nn.TransformerEncoderLayer):
        mha = module.self_attn
        _check_mha(mha, _join(block.name, "self_attn"))
        return _Resolved(
            block.name,
            "encoder",
            _join(block.name, "self_attn"),
            None,
            None,
            None,
            _join(block.name, "self_attn", "out_proj"),
            mha.num_heads,
            mha.head_dim,
            None,
            None,
            [_join(block.name, "linear1")],
            _join(block.name, "linear2"),
        )
    att_rel = block.attention or _first(module, ATTENTION_NAMES, "attention module", block.name)
    attention = _join(block.name, att_rel)
    att = model.get_submodule(attention)
    mlp_rel = block.mlp or _first(module, MLP_NAMES, "MLP module", block.name)
    mlp = _join(block.name, mlp_rel)
    mlp_module = model.get_submodule(mlp)
    ups = block.up
    if ups is None:
        ups = [n for n in UP_NAMES if isinstance(getattr(mlp_module, n, None), nn.Linear)]
    ups = [ups] if isinstance(ups, str) else list(ups)
    down_rel = block.down or _first(mlp_module, [n for n in DOWN_NAMES if n not in ups], "second (down) MLP layer", mlp)
    if not ups:
        raise ValueError(f"{mlp}: no first (up) MLP layer among the default names {list(UP_NAMES)}; name it")
    up = [_join(mlp, u) for u in ups]
    down = _join(mlp, down_rel)
    down_layer = _linear(model, down, "down")
    for name in up:
        if _linear(model, name, "up").out_features != down_layer.in_features:
            raise ValueError(
                f"{name} has {model.get_submodule(name).out_features} outputs, {down} {down_layer.in_features} inputs"
            )
    if isinstance(att, nn.MultiheadAttention):
        _check_mha(att, attention)
        return _Resolved(
            block.name, "mha", attention, None, None, None, _join(attention, "out_proj"),
            att.num_heads, att.head_dim, None, mlp, up, down,
        )  # fmt: skip
    names = {}
    for key, defaults in (("q", Q_NAMES), ("k", K_NAMES), ("v", V_NAMES), ("out", OUT_NAMES)):
        rel = getattr(block, key) or _first(att, defaults, f"{key} projection", attention)
        names[key] = _join(attention, rel)
        _linear(model, names[key], key)
    heads_attr = block.heads_attr
    if heads_attr is None:
        heads_attr = next((a for a in HEADS_ATTRS if isinstance(getattr(att, a, None), int)), None)
    num_heads = block.num_heads if block.num_heads is not None else getattr(att, heads_attr or "", None)
    if heads_attr is None or not isinstance(num_heads, int):
        raise ValueError(
            f"{attention}: the head count is read from an int attribute of the attention module "
            f"(one of {list(HEADS_ATTRS)}, or heads_attr=...), which prune() lowers; none found"
        )
    q = model.get_submodule(names["q"])
    width = q.out_features
    if num_heads <= 0 or width % num_heads:
        raise ValueError(f"{attention}: {width} query features do not split into num_heads={num_heads} heads")
    for key in ("k", "v"):
        if model.get_submodule(names[key]).out_features != width:
            raise ValueError(f"{names[key]} has {model.get_submodule(names[key]).out_features} outputs, q {width}")
    if model.get_submodule(names["out"]).in_features != width:
        inputs = model.get_submodule(names["out"]).in_features
        raise ValueError(f"{names['out']} has {inputs} inputs, q {width} outputs")
    return _Resolved(
        block.name, "linear", attention, names["q"], names["k"], names["v"], names["out"],
        num_heads, width // num_heads, heads_attr, mlp, up, down,
    )  # fmt: skip


def _check_mha(mha, name):
    if mha.bias_k is not None or mha.add_zero_attn:
        raise NotImplementedError(f"{name}: add_bias_kv and add_zero_attn are not supported")


def _auto_blocks(model):
    """Every ``nn.TransformerEncoderLayer`` and every module with a default attention and MLP child."""
    out = []
    for name, m in model.named_modules():
        if isinstance(m, nn.TransformerEncoderLayer):
            out.append(name)
        elif any(isinstance(getattr(m, a, None), nn.Module) for a in ATTENTION_NAMES) and any(
            isinstance(getattr(m, a, None), nn.Module) for a in MLP_NAMES
        ):
            out.append(name)
    return out


# ---------------------------------------------------------------------------------------------- gates


class _TransformerGate(L0Layer):
    """A transformer gate: an :class:`~l0bayes.nn.L0Layer` holding ``gate``, a child of its block."""

    def __init__(self, num_gates, group_size, **gate_kwargs):
        super().__init__()
        self.gate = HardConcreteGate(num_gates, group_size=group_size, **gate_kwargs)
        self._groups = []  # [(module, name of parameter, dim, width)]: what each gate scales, for Eq. 17

    def expected_l2(self):
        r"""Eq. 17: :math:`\sum_g q(z_g \ne 0) \|\tilde\theta_g\|^2` over the parameters the gates remove."""
        q = self.prob_nonzero()
        total = q.new_zeros(())
        for module, attr, dim, width in self._groups:
            p = getattr(module, attr) if "." not in attr else module.get_parameter(attr)
            if p is None:
                continue
            sq = p.pow(2).movedim(dim, 0).reshape(q.shape[0], width, -1).sum((1, 2)) if width else p.pow(2).sum()
            total = total + (q * sq).sum()
        return total


class HeadGate(_TransformerGate):
    """One gate per attention head of a block, multiplying the head's output before the output projection.

    Held by the block as ``l0_heads``; a forward pre-hook scales the input of the output projection,
    viewed as ``(..., num_heads, head_dim)``. ``group_size``: the parameters of one head.
    """

    def __init__(self, num_heads, head_dim, group_size, **gate_kwargs):
        super().__init__(num_heads, group_size, **gate_kwargs)
        self.num_heads, self.head_dim = int(num_heads), int(head_dim)

    def extra_repr(self):
        return f"num_heads={self.num_heads}, head_dim={self.head_dim}"

    def _gate_heads(self, module, args):
        x = args[0]
        z = self.gate().to(x.dtype)
        y = x.unflatten(-1, (self.num_heads, self.head_dim)) * z.unsqueeze(-1)
        return (y.flatten(-2), *args[1:])


class UnitGate(_TransformerGate):
    """One gate per intermediate unit of a block's MLP, on the input of its second linear layer (``l0_units``)."""

    def _gate_units(self, module, args):
        return (args[0] * self.gate().to(args[0].dtype), *args[1:])


class LayerGate(_TransformerGate):
    r"""One scalar gate on a residual branch, :math:`x + z f(x)` (``l0_attention``, ``l0_mlp`` of a block).

    The final phase of the constrained objective may close it (a block's branch may go entirely).
    """

    may_close_all = True

    def _gate_output(self, module, args, output):
        if isinstance(output, tuple):
            return (output[0] * self.gate().to(output[0].dtype), *output[1:])
        return output * self.gate().to(output.dtype)


# ------------------------------------------------------------------------------ attention, explicitly


def _merge_masks(attn_mask, key_padding_mask, batch, num_heads, length, source, dtype):
    """One additive float mask, broadcastable to ``(batch, num_heads, length, source)``, or ``None``."""
    mask = None
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            attn_mask = torch.zeros_like(attn_mask, dtype=dtype).masked_fill(attn_mask, float("-inf"))
        mask = attn_mask.to(dtype)
        mask = mask.view(batch, num_heads, length, source) if mask.dim() == 3 else mask.view(1, 1, length, source)
    if key_padding_mask is not None:
        if key_padding_mask.dtype == torch.bool:
            pad = torch.zeros_like(key_padding_mask, dtype=dtype).masked_fill(key_padding_mask, float("-inf"))
        else:
            pad = key_padding_mask.to(dtype)
        pad = pad.view(batch, 1, 1, source)
        mask = pad if mask is None else mask + pad
    return mask


def _attend(q, k, v, num_heads, head_dim, attn_mask, key_padding_mask, is_causal, dropout, training):
    """Scaled dot-product attention of batch-first projections ``(B, L, H * d)``: ``(B, L, H * d)``, weights."""
    batch, length, source = q.shape[0], q.shape[1], k.shape[1]
    q = q.view(batch, length, num_heads, head_dim).transpose(1, 2)
    k = k.view(batch, source, num_heads, head_dim).transpose(1, 2)
    v = v.view(batch, source, num_heads, head_dim).transpose(1, 2)
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(head_dim)
    mask = _merge_masks(attn_mask, key_padding_mask, batch, num_heads, length, source, scores.dtype)
    if mask is None and is_causal:
        causal = torch.ones(length, source, dtype=torch.bool, device=q.device).triu(1)
        mask = torch.zeros(length, source, dtype=scores.dtype, device=q.device).masked_fill(causal, float("-inf"))
    if mask is not None:
        scores = scores + mask
    weights = torch.softmax(scores, dim=-1)
    if dropout > 0.0 and training:
        weights = F.dropout(weights, p=dropout)
    out = (weights @ v).transpose(1, 2).reshape(batch, length, num_heads * head_dim)
    return out, weights


def _mha_forward(
    self, q_in, k_in, v_in, query, key, value, key_padding_mask, need_weights, attn_mask, average, is_causal
):
    """``nn.MultiheadAttention``'s computation with the projections ``q_in, k_in, v_in`` and ``self.out_proj``."""
    batched = query.dim() == 3
    if not batched:  # one sequence: a batch of one
        query, key, value = query.unsqueeze(0), key.unsqueeze(0), value.unsqueeze(0)
        if key_padding_mask is not None:
            key_padding_mask = key_padding_mask.unsqueeze(0)
    elif not self.batch_first:
        query, key, value = query.transpose(0, 1), key.transpose(0, 1), value.transpose(0, 1)
    heads, weights = _attend(
        q_in(query), k_in(key), v_in(value), self.num_heads, self.head_dim, attn_mask, key_padding_mask,
        is_causal, self.dropout, self.training,
    )  # fmt: skip
    out = self.out_proj(heads)
    if not batched:
        out = out.squeeze(0)
    elif not self.batch_first:
        out = out.transpose(0, 1)
    if not need_weights:
        return out, None
    weights = weights.mean(1) if average else weights
    return out, weights.squeeze(0) if not batched else weights


class _ExplicitMultiheadAttention(nn.MultiheadAttention):
    """``nn.MultiheadAttention`` computed step by step, calling ``out_proj`` as a module (where the head gates are).

    :func:`sparsify_transformer` sets a gated attention's class to this one: its parameters and state-dict keys
    are unchanged, and its output equals the original's (without the fused fast path that skips module hooks).
    """

    def forward(
        self,
        query,
        key,
        value,
        key_padding_mask=None,
        need_weights=True,
        attn_mask=None,
        average_attn_weights=True,
        is_causal=False,
    ):
        e = self.embed_dim
        if self._qkv_same_embed_dim:
            wq, wk, wv = self.in_proj_weight[:e], self.in_proj_weight[e : 2 * e], self.in_proj_weight[2 * e :]
        else:
            wq, wk, wv = self.q_proj_weight, self.k_proj_weight, self.v_proj_weight
        b = self.in_proj_bias
        bq, bk, bv = (None, None, None) if b is None else (b[:e], b[e : 2 * e], b[2 * e :])
        return _mha_forward(
            self,
            lambda x: F.linear(x, wq, bq),
            lambda x: F.linear(x, wk, bk),
            lambda x: F.linear(x, wv, bv),
            query,
            key,
            value,
            key_padding_mask,
            need_weights,
            attn_mask,
            average_attn_weights,
            is_causal,
        )


class PrunedMultiheadAttention(nn.Module):
    """A plain multi-head attention with separate ``q_proj``, ``k_proj``, ``v_proj``, ``out_proj`` ``nn.Linear`` s.

    What :func:`prune_transformer` makes of a gated ``nn.MultiheadAttention``: the kept heads only; the same
    call signature and output (the attention weights, when asked for, are those of the kept heads).
    """

    def __init__(self, embed_dim, num_heads, head_dim, kdim=None, vdim=None, bias=True, batch_first=False, dropout=0.0):
        super().__init__()
        self.embed_dim, self.num_heads, self.head_dim = int(embed_dim), int(num_heads), int(head_dim)
        self.batch_first, self.dropout = bool(batch_first), float(dropout)
        width = self.num_heads * self.head_dim
        self.q_proj = nn.Linear(embed_dim, width, bias=bias)
        self.k_proj = nn.Linear(kdim or embed_dim, width, bias=bias)
        self.v_proj = nn.Linear(vdim or embed_dim, width, bias=bias)
        self.out_proj = nn.Linear(width, embed_dim, bias=bias)

    def extra_repr(self):
        return f"num_heads={self.num_heads}, head_dim={self.head_dim}, batch_first={self.batch_first}"

    def forward(
        self,
        query,
        key,
        value,
        key_padding_mask=None,
        need_weights=True,
        attn_mask=None,
        average_attn_weights=True,
        is_causal=False,
    ):
        return _mha_forward(
            self, self.q_proj, self.k_proj, self.v_proj, query, key, value, key_padding_mask, need_weights,
            attn_mask, average_attn_weights, is_causal,
        )  # fmt: skip


class ZeroBranch(nn.Module):
    """A removed residual branch: zeros shaped like its first input (a pair ``(zeros, None)`` for an attention
    module that returns one, as ``nn.MultiheadAttention`` does)."""

    def __init__(self, pair=False, batch_first=False):
        super().__init__()
        self.pair, self.batch_first = bool(pair), bool(batch_first)

    def extra_repr(self):
        return f"pair={self.pair}"

    def forward(self, x, *args, **kwargs):
        zeros = torch.zeros_like(x)
        return (zeros, None) if self.pair else zeros


# ------------------------------------------------------------------------------------- encoder layers


def _encoder_forward(layer, src, src_mask, src_key_padding_mask, is_causal, z_attention, z_mlp, feed_forward=True):
    """``nn.TransformerEncoderLayer``'s slow path, with the branches scaled by ``z_attention`` / ``z_mlp``."""
    src_key_padding_mask = F._canonical_mask(
        mask=src_key_padding_mask,
        mask_name="src_key_padding_mask",
        other_type=F._none_or_dtype(src_mask),
        other_name="src_mask",
        target_type=src.dtype,
    )
    src_mask = F._canonical_mask(
        mask=src_mask, mask_name="src_mask", other_type=None, other_name="", target_type=src.dtype, check_other=False
    )

    def attention(x):
        out = layer.self_attn(
            x, x, x, attn_mask=src_mask, key_padding_mask=src_key_padding_mask, need_weights=False, is_causal=is_causal
        )[0]
        out = layer.dropout1(out)
        return out if z_attention is None else out * z_attention.to(out.dtype)

    def mlp(x):
        out = layer.dropout2(layer.linear2(layer.dropout(layer.activation(layer.linear1(x)))))
        return out if z_mlp is None else out * z_mlp.to(out.dtype)

    x = src
    if layer.norm_first:
        x = x + attention(layer.norm1(x))
        if feed_forward:
            x = x + mlp(layer.norm2(x))
    else:
        x = layer.norm1(x + attention(x))
        x = layer.norm2(x + mlp(x)) if feed_forward else layer.norm2(x)
    return x


class _GatedTransformerEncoderLayer(nn.TransformerEncoderLayer):
    """``nn.TransformerEncoderLayer`` on its slow path, with its branch gates ``l0_attention`` / ``l0_mlp``."""

    def forward(self, src, src_mask=None, src_key_padding_mask=None, is_causal=False):
        z_a = self.l0_attention.gate() if hasattr(self, "l0_attention") else None
        z_m = self.l0_mlp.gate() if hasattr(self, "l0_mlp") else None
        return _encoder_forward(self, src, src_mask, src_key_padding_mask, is_causal, z_a, z_m)


class PrunedTransformerEncoderLayer(nn.Module):
    """A pruned ``nn.TransformerEncoderLayer``: the same computation (its slow path), smaller layers.

    ``self_attn`` is a :class:`PrunedMultiheadAttention` or, for a removed branch, a :class:`ZeroBranch`;
    with ``feed_forward=False`` the MLP branch is gone (``linear1`` and ``linear2`` are ``None``).
    """

    def __init__(self, layer, self_attn, feed_forward):
        super().__init__()
        self.self_attn = self_attn
        self.feed_forward = bool(feed_forward)
        self.linear1 = layer.linear1 if feed_forward else None
        self.dropout = layer.dropout
        self.linear2 = layer.linear2 if feed_forward else None
        self.norm_first = layer.norm_first
        self.norm1, self.norm2 = layer.norm1, layer.norm2
        self.dropout1, self.dropout2 = layer.dropout1, layer.dropout2
        self.activation = layer.activation

    def forward(self, src, src_mask=None, src_key_padding_mask=None, is_causal=False):
        return _encoder_forward(self, src, src_mask, src_key_padding_mask, is_causal, None, None, self.feed_forward)


# ------------------------------------------------------------------------------------------- sparsify


def _set(model, name, module):
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, module)


def _head_groups(model, r):
    """``[(module, parameter, dim, width)]`` of the parameters one head owns, and the parameters per head."""
    d = r.head_dim
    if r.kind == "linear":
        groups = []
        for name in (r.q, r.k, r.v):
            m = model.get_submodule(name)
            groups += [(m, "weight", 0, d), (m, "bias", 0, d)]
        groups.append((model.get_submodule(r.out), "weight", 1, d))
    else:
        mha = model.get_submodule(r.attention)
        if mha._qkv_same_embed_dim:
            groups = [(_ThirdsView(mha, "in_proj_weight", i), "value", 0, d) for i in range(3)]
        else:
            groups = [(mha, a, 0, d) for a in ("q_proj_weight", "k_proj_weight", "v_proj_weight")]
        if mha.in_proj_bias is not None:
            groups += [(_ThirdsView(mha, "in_proj_bias", i), "value", 0, d) for i in range(3)]
        groups.append((mha.out_proj, "weight", 1, d))
    per_head = 0
    for module, attr, dim, width in groups:
        p = getattr(module, attr)
        if p is not None:
            per_head += p.numel() // (p.shape[dim] // width)
    return groups, per_head


class _ThirdsView:
    """One third (q, k or v) of an attention's packed ``in_proj_weight`` / ``in_proj_bias``, read on access."""

    def __init__(self, module, attr, i):
        self.module, self.attr, self.i = module, attr, i

    @property
    def value(self):
        p = getattr(self.module, self.attr)
        e = p.shape[0] // 3
        return p[self.i * e : (self.i + 1) * e]


def _unit_groups(model, r):
    groups = []
    for name in r.up:
        m = model.get_submodule(name)
        groups += [(m, "weight", 0, 1), (m, "bias", 0, 1)]
    groups.append((model.get_submodule(r.down), "weight", 1, 1))
    per_unit = sum(model.get_submodule(n).in_features + (model.get_submodule(n).bias is not None) for n in r.up)
    return groups, per_unit + model.get_submodule(r.down).out_features


def _branch_modules(model, r):
    """``(attention branch modules, MLP branch modules)``: what a closed branch removes."""
    attention = [model.get_submodule(r.attention)]
    if r.kind == "encoder":
        mlp = [model.get_submodule(n) for n in (*r.up, r.down)]
    else:
        mlp = [model.get_submodule(r.mlp)]
    return attention, mlp


def _own_parameters(modules):
    seen = set()
    total = 0
    for m in modules:
        for p in m.parameters():
            if id(p) not in seen and not _is_gate_parameter(m, p):
                seen.add(id(p))
                total += p.numel()
    return total


def _is_gate_parameter(module, p):
    return any(p is g.log_alpha for g in module.modules() if isinstance(g, HardConcreteGate))


def sparsify_transformer(
    model, blocks=None, *, example_inputs, heads=True, units=True, layers=True, inplace=False, **gate_kwargs
):
    r"""Attach head, unit and branch gates to the blocks of a transformer; returns the gated model.

    :param model: any :class:`torch.nn.Module` holding transformer blocks.
    :param blocks: the blocks to gate: a list of names or :class:`Block` s. Default: every
        ``nn.TransformerEncoderLayer``, and every module with an attention and an MLP child of a default name
        (:data:`ATTENTION_NAMES`, :data:`MLP_NAMES`).
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
    for r in resolved:
        _attach_block(model, r, heads, units, layers, gate_kwargs)
    for m in model.modules():  # the nested-tensor fast path would skip the gates
        if isinstance(m, nn.TransformerEncoder):
            m.use_nested_tensor = False
    object.__setattr__(model, "_l0_transformer", resolved)
    object.__setattr__(model, "_l0_example_inputs", tuple(t[:1].detach().clone() for t in _as_tuple(example_inputs)))
    return model


def _attach_block(model, r, heads, units, layers, gate_kwargs):
    block = model.get_submodule(r.name)
    attention = model.get_submodule(r.attention)
    if r.kind in ("encoder", "mha"):
        attention.__class__ = _ExplicitMultiheadAttention
    if r.kind == "encoder":
        block.__class__ = _GatedTransformerEncoderLayer
    att_modules, mlp_modules = _branch_modules(model, r)
    if heads:
        groups, per_head = _head_groups(model, r)
        holder = HeadGate(r.num_heads, r.head_dim, per_head, **gate_kwargs)
        holder._groups = groups
        block.l0_heads = holder
        model.get_submodule(r.out).register_forward_pre_hook(holder._gate_heads)
    if units:
        groups, per_unit = _unit_groups(model, r)
        down = model.get_submodule(r.down)
        holder = UnitGate(down.in_features, per_unit, **gate_kwargs)
        holder._groups = groups
        block.l0_units = holder
        down.register_forward_pre_hook(holder._gate_units)
    if layers:
        for key, modules, hooked in (("l0_attention", att_modules, r.attention), ("l0_mlp", mlp_modules, r.mlp)):
            holder = LayerGate(1, max(1, _own_parameters(modules)), **gate_kwargs)
            holder._groups = [(m, n, 0, 0) for m in modules for n, _ in m.named_parameters()]
            setattr(block, key, holder)
            if r.kind != "encoder":  # the encoder layer's forward calls its branch gates itself
                model.get_submodule(hooked).register_forward_hook(holder._gate_output)


def is_transformer_gated(module):
    """Whether ``module`` holds gates attached by :func:`sparsify_transformer`."""
    return getattr(module, "_l0_transformer", None) is not None


# ---------------------------------------------------------------------------------------------- prune


def _keep(z):
    """The heads / units to keep: open Eq. 13 gates, and at least one (the first) where all are closed."""
    keep = z > 0
    if not keep.any():
        keep[0] = True
    return keep


def _linear_like(weight, bias):
    new = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, device=weight.device, dtype=weight.dtype)
    new.weight.copy_(weight)
    if bias is not None:
        new.bias.copy_(bias)
    return new


def _gate_value(block, key):
    holder = getattr(block, key, None)
    return None if holder is None else holder.gate.deterministic()


@torch.no_grad()
def _prune_attention(plain, r, block):
    """Replace the attention of block ``r`` by its kept heads (Eq. 13 values folded), or a :class:`ZeroBranch`."""
    z_layer = _gate_value(block, "l0_attention")
    att = plain.get_submodule(r.attention)
    if z_layer is not None and float(z_layer) == 0.0:
        mha = isinstance(att, nn.MultiheadAttention)
        _set(plain, r.attention, ZeroBranch(pair=mha, batch_first=getattr(att, "batch_first", False)))
        return
    z_heads = _gate_value(block, "l0_heads")
    h, d = r.num_heads, r.head_dim
    out = plain.get_submodule(r.out)
    z_heads = torch.ones(h, device=out.weight.device, dtype=out.weight.dtype) if z_heads is None else z_heads
    keep = _keep(z_heads)
    rows = keep.repeat_interleave(d)
    scale = z_heads.to(out.weight.dtype).repeat_interleave(d)[rows]
    z = 1.0 if z_layer is None else z_layer.to(out.weight.dtype)
    out_weight = out.weight[:, rows] * scale * z
    out_bias = None if out.bias is None else out.bias * z
    if r.kind == "linear":
        for name in (r.q, r.k, r.v):
            m = plain.get_submodule(name)
            _set(plain, name, _linear_like(m.weight[rows], None if m.bias is None else m.bias[rows]))
        _set(plain, r.out, _linear_like(out_weight, out_bias))
        setattr(att, r.heads_attr, int(keep.sum()))
        if isinstance(getattr(att, "all_head_size", None), int):
            att.all_head_size = int(keep.sum()) * d
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
        e, int(keep.sum()), d, att.kdim, att.vdim, bias=b is not None, batch_first=att.batch_first, dropout=att.dropout
    ).to(device=out.weight.device, dtype=out.weight.dtype)
    for proj, w_, b_ in zip((new.q_proj, new.k_proj, new.v_proj), weights, biases, strict=True):
        proj.weight.copy_(w_[rows])
        if b_ is not None:
            proj.bias.copy_(b_[rows])
    new.out_proj = _linear_like(out_weight, out_bias)
    _set(plain, r.attention, new)


@torch.no_grad()
def _prune_mlp(plain, r, block):
    """Remove the closed units of block ``r``'s MLP (Eq. 13 values folded), or the whole branch. ``False``: gone."""
    z_layer = _gate_value(block, "l0_mlp")
    if z_layer is not None and float(z_layer) == 0.0:
        if r.kind != "encoder":
            _set(plain, r.mlp, ZeroBranch())
        return False
    down = plain.get_submodule(r.down)
    z_units = _gate_value(block, "l0_units")
    if z_units is None:
        z_units = torch.ones(down.in_features, device=down.weight.device, dtype=down.weight.dtype)
    keep = _keep(z_units)
    z = 1.0 if z_layer is None else z_layer.to(down.weight.dtype)
    for name in r.up:
        m = plain.get_submodule(name)
        _set(plain, name, _linear_like(m.weight[keep], None if m.bias is None else m.bias[keep]))
    weight = down.weight[:, keep] * z_units.to(down.weight.dtype)[keep] * z
    _set(plain, r.down, _linear_like(weight, None if down.bias is None else down.bias * z))
    return True


def _strip_hooks(plain):
    """Remove every hook of the transformer gates, from every module."""
    holders = [m for m in plain.modules() if isinstance(m, _TransformerGate)]
    for m in plain.modules():
        for holder in holders:
            _remove_hooks(m, holder)


@torch.no_grad()
def prune_transformer(model, example_inputs=None):
    r"""A plain module equal to the gated ``model`` in ``eval()`` mode, without its closed heads, units and branches.

    For every gated block, with the Eq. 13 gates :math:`\hat z`: the rows of :math:`W_Q, W_K, W_V` (and biases)
    and the columns of :math:`W_O` of the closed heads are removed, and the attention's head count attribute
    lowered (an ``nn.MultiheadAttention`` becomes a :class:`PrunedMultiheadAttention`); the rows and biases of
    the MLP's first layer(s) and the columns of its second layer of the closed units are removed; a closed branch
    becomes a :class:`ZeroBranch` (in an ``nn.TransformerEncoderLayer``, which becomes a
    :class:`PrunedTransformerEncoderLayer`, the branch is dropped). A block keeps at least one head and one unit.
    The open gates' values are folded into the output projection's columns, the second MLP layer's columns and
    each branch's last layer.

    The result is checked against the gated model on ``example_inputs`` (default: those given to
    :func:`sparsify_transformer`) in float64; a ``ValueError`` says when the attention's forward does not
    follow the lowered head count.
    """
    if not is_transformer_gated(model):
        raise ValueError("prune_transformer needs a model of sparsify_transformer()")
    example_inputs = _as_tuple(example_inputs if example_inputs is not None else model._l0_example_inputs)
    plain = copy.deepcopy(model).eval()
    _strip_hooks(plain)
    resolved = plain._l0_transformer
    for attr in ("_l0_transformer", "_l0_example_inputs"):
        object.__delattr__(plain, attr)
    for r in resolved:
        block = plain.get_submodule(r.name)
        _prune_attention(plain, r, block)
        feed_forward = _prune_mlp(plain, r, block)
        for key in ("l0_heads", "l0_units", "l0_attention", "l0_mlp"):
            if hasattr(block, key):
                delattr(block, key)
        if r.kind == "encoder":
            _set(plain, r.name, PrunedTransformerEncoderLayer(block, block.self_attn, feed_forward))
    _check_equal(model, plain, example_inputs)
    return plain.eval()


def _check_equal(model, plain, example_inputs):
    probe = tuple(
        t.repeat(2, *([1] * (t.dim() - 1))).double() if t.is_floating_point() else t.repeat(2, *([1] * (t.dim() - 1)))
        for t in example_inputs
    )
    gated64 = copy.deepcopy(model).double().eval()
    plain64 = copy.deepcopy(plain).double().eval()
    with torch.no_grad():
        try:
            a, b = gated64(*probe), plain64(*probe)
        except RuntimeError as err:
            raise ValueError(
                f"the pruned model does not run ({str(err).splitlines()[0]}): does the attention's forward read its "
                "head count from the attribute prune() lowers, rather than from the embedding width?"
            ) from None
    a = a if torch.is_tensor(a) else torch.cat([o.flatten() for o in a])
    b = b if torch.is_tensor(b) else torch.cat([o.flatten() for o in b])
    # the gates are folded in the model's precision: a structural mismatch is far larger than its rounding
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    scale = float(a.abs().max()) + 1.0
    if a.shape != b.shape or float((a - b).abs().max()) > 100 * torch.finfo(dtype).eps * scale:
        raise ValueError(
            "the pruned model differs from the gated one: does the attention's forward read its head count from "
            "the attribute prune() lowers, and is each branch's output its last linear layer's (scaled) output?"
        )


# ---------------------------------------------------------------------------------------------- sizes


def _tokens(inputs):
    x = inputs[0]
    return x.numel() if not x.is_floating_point() else math.prod(x.shape[:-1])


def _linear_calls(module, example_inputs):
    """``{id(linear): positions}`` summed over the calls of every ``nn.Linear`` in one eval forward, and the tokens.

    An ``nn.MultiheadAttention`` computing its projections itself counts as its four projections.
    """
    calls = {}

    def linear_hook(m, args, output):
        calls[id(m)] = calls.get(id(m), 0) + math.prod(output.shape[:-1])

    def mha_hook(m, args, kwargs, output):
        query, key, value = (list(args) + [kwargs.get(k) for k in ("query", "key", "value")][len(args) :])[:3]
        for tag, x in (("q", query), ("k", key), ("v", value)):
            calls[(id(m), tag)] = calls.get((id(m), tag), 0) + math.prod(x.shape[:-1])

    hooks = [
        m.register_forward_hook(linear_hook)
        for m in module.modules()
        if isinstance(m, nn.Linear) and not isinstance(m, nn.modules.linear.NonDynamicallyQuantizableLinear)
    ]
    for m in module.modules():
        if isinstance(m, nn.MultiheadAttention):
            hooks.append(m.register_forward_hook(mha_hook, with_kwargs=True))
            hooks.append(m.out_proj.register_forward_hook(linear_hook))
    inputs = _as_tuple(example_inputs)
    _probe_forward(module, inputs, hooks)
    return calls, _tokens(inputs)


def flops_per_token(module, example_inputs):
    """FLOPs per token of the linear layers in one forward pass, counted as :func:`~l0bayes.pruning.flops` counts.

    ``2 * in * out + out`` (the last term with a bias) per position of every ``nn.Linear`` call (including the
    projections of an ``nn.MultiheadAttention``), divided by the tokens of the first input (its elements for
    token ids; its leading dimensions for embeddings). Attention's score and weighted-sum products, embeddings,
    normalisation and activations are not counted; gates count as their dense layers. A float.
    """
    calls, tokens = _linear_calls(module, example_inputs)
    total = 0
    for m in module.modules():
        if isinstance(m, nn.MultiheadAttention) and (id(m), "q") in calls:
            e = m.embed_dim
            for tag, dim in (("q", e), ("k", m.kdim), ("v", m.vdim)):
                total += (2 * dim * e + (e if m.in_proj_bias is not None else 0)) * calls[(id(m), tag)]
            if id(m.out_proj) not in calls:  # the fused path uses out_proj's weights without calling it
                out = m.out_proj
                total += (2 * e * e + (e if out.bias is not None else 0)) * calls[(id(m), "q")]
        if isinstance(m, nn.Linear) and id(m) in calls:
            total += (2 * m.in_features * m.out_features + (m.out_features if m.bias is not None else 0)) * calls[id(m)]
    return total / tokens


class _BranchCount:
    """``gate * (const + per * n)`` for one branch: parameters and FLOPs per token."""

    __slots__ = ("layer", "width", "const", "per", "const_flops", "per_flops", "dense", "dense_flops")

    def __init__(self, layer, width, const, per, const_flops, per_flops):
        self.layer, self.width = layer, width  # the head / unit gate (None: all kept), the gate count
        self.const, self.per, self.const_flops, self.per_flops = const, per, const_flops, per_flops
        self.dense = const + per * width
        self.dense_flops = const_flops + per_flops * width

    def count(self, values, exact, flops, like):
        n = like.new_tensor(float(self.width)) if self.layer is None else values[id(self.layer)].to(like).sum()
        if exact:
            n = n.clamp(min=1.0)
        const, per = (self.const_flops, self.per_flops) if flops else (self.const, self.per)
        return const + per * n


class TransformerSize:
    r"""The parameters and FLOPs per token that :func:`prune_transformer` keeps of a gated transformer.

    The interface of :class:`~l0bayes.pruning.NetworkSize` (:meth:`parameters`, :meth:`flops`, :meth:`fraction`,
    :meth:`fraction_at`), which :func:`~l0bayes.pruning.network_size` returns for a model of
    :func:`sparsify_transformer`; the formula is in the module docstring. Per gated layer (``per_layer=True``):
    the branch the gate belongs to (a head gate: the attention branch, a unit gate: the MLP branch), over its
    dense count.

    :param module: the gated model, or a model holding it as ``net`` (e.g. :class:`~l0bayes.models.SparseModel`).
    """

    cascade = True

    def __init__(self, module, input_shape=None):
        net = getattr(module, "net", module)
        net = net if is_transformer_gated(net) else module
        if not is_transformer_gated(net):
            raise ValueError("TransformerSize needs a model of sparsify_transformer()")
        self.net = net
        self.input_shape = input_shape
        owners = gate_owners(net)
        self.gates = [gate for _, gate in owners]
        self.gated = [layer for layer, _ in owners]
        self.names = density_names(module)
        calls, tokens = _linear_calls(net, net._l0_example_inputs)
        self.calls = calls  # (not None: FLOPs per token need no input shape)
        per_token = {k: v / tokens for k, v in calls.items()}
        self.branches = []  # [(branch gate or None, _BranchCount)]
        self._branch_of = {}  # id(gated layer) -> index into branches
        inside = set()
        for r in net._l0_transformer:
            block = net.get_submodule(r.name)
            att_modules, mlp_modules = _branch_modules(net, r)
            for modules in (att_modules, mlp_modules):
                for m in modules:
                    inside.update(id(p) for p in m.parameters())
                    inside.update(id(s) for s in m.modules())
            self._add(block, "l0_attention", "l0_heads", self._attention_count(net, r, block, att_modules, per_token))
            self._add(block, "l0_mlp", "l0_units", self._mlp_count(net, r, block, mlp_modules, per_token))
        gate_params = {id(g.log_alpha) for g in self.gates}
        self.const = sum(p.numel() for p in net.parameters() if id(p) not in inside and id(p) not in gate_params)
        self.const_flops = 0.0
        for m in net.modules():
            if isinstance(m, nn.Linear) and id(m) not in inside and id(m) in per_token:
                self.const_flops += (2 * m.in_features * m.out_features + (m.bias is not None) * m.out_features) * (
                    per_token[id(m)]
                )
        self.dense_parameters = self.const + sum(c.dense for _, c in self.branches)
        self.dense_flops = self.const_flops + sum(c.dense_flops for _, c in self.branches)
        assert self.dense_parameters == count_parameters(net), "the branches do not cover the model's parameters"

    def _add(self, block, branch_key, inner_key, count):
        index = len(self.branches)
        self.branches.append((getattr(block, branch_key, None), count))
        for key in (branch_key, inner_key):
            holder = getattr(block, key, None)
            if holder is not None:
                self._branch_of[id(holder)] = index

    @staticmethod
    def _attention_count(net, r, block, modules, per_token):
        d, h = r.head_dim, r.num_heads
        _, per_head = _head_groups(net, r)
        total = _own_parameters(modules)
        const = total - per_head * h
        att = net.get_submodule(r.attention)
        out = net.get_submodule(r.out)
        if r.kind == "linear":
            projections = [net.get_submodule(n) for n in (r.q, r.k, r.v)]
            projections = [(m, per_token.get(id(m), 0.0)) for m in projections]
            per_flops = sum((2 * m.in_features + (m.bias is not None)) * d * pos for m, pos in projections)
        else:
            bias = att.in_proj_bias is not None
            dims = {"q": att.embed_dim, "k": att.kdim, "v": att.vdim}
            per_flops = sum((2 * dims[t] + bias) * d * per_token.get((id(att), t), 0.0) for t in "qkv")
        pos = per_token.get(id(out), 0.0)
        per_flops += 2 * d * out.out_features * pos
        const_flops = (out.bias is not None) * out.out_features * pos
        return _BranchCount(getattr(block, "l0_heads", None), h, const, per_head, const_flops, per_flops)

    @staticmethod
    def _mlp_count(net, r, block, modules, per_token):
        _, per_unit = _unit_groups(net, r)
        down = net.get_submodule(r.down)
        width = down.in_features
        const = _own_parameters(modules) - per_unit * width
        per_flops = 2 * down.out_features * per_token.get(id(down), 0.0)
        ups = [net.get_submodule(n) for n in r.up]
        per_flops += sum((2 * m.in_features + (m.bias is not None)) * per_token.get(id(m), 0.0) for m in ups)
        const_flops = (down.bias is not None) * down.out_features * per_token.get(id(down), 0.0)
        skip = {id(down), *(id(m) for m in ups)}
        for module in modules:  # other linear layers inside the MLP module
            for m in module.modules():
                if isinstance(m, nn.Linear) and id(m) not in skip and id(m) in per_token:
                    const_flops += (2 * m.in_features * m.out_features + (m.bias is not None) * m.out_features) * (
                        per_token[id(m)]
                    )
        return _BranchCount(getattr(block, "l0_units", None), width, const, per_unit, const_flops, per_flops)

    # ------------------------------------------------------------------ values
    def _values(self, kind):
        values = {}
        for layer, gate in zip(self.gated, self.gates, strict=True):
            if kind == "expected":
                values[id(layer)] = gate.prob_nonzero()
            elif kind == "test":
                values[id(layer)] = gate.active().to(torch.float64)
            else:
                values[id(layer)] = torch.ones_like(gate.log_alpha.detach(), dtype=torch.float64)
        return values

    def _branch(self, index, values, exact, flops, like):
        gate, count = self.branches[index]
        value = count.count(values, exact, flops, like)
        return value if gate is None else value * values[id(gate)].to(like).sum()

    def _count(self, values, exact, flops):
        like = next(iter(values.values())).new_zeros(())
        total = like + (self.const_flops if flops else self.const)
        for i in range(len(self.branches)):
            total = total + self._branch(i, values, exact, flops, like)
        return total

    def _measure(self, what, kind, per_layer, fraction, values=None):
        if what not in ("parameters", "flops"):
            raise ValueError(f"what must be 'parameters' or 'flops', got {what!r}")
        if kind not in ("expected", "test"):
            raise ValueError(f"kind must be 'expected' or 'test', got {kind!r}")
        exact = kind == "test"
        flops = what == "flops"
        values = self._values(kind) if values is None else values
        if not per_layer:
            value = self._count(values, exact, flops)
            if fraction:
                value = value / (self.dense_flops if flops else self.dense_parameters)
            return float(value) if exact else value
        like = next(iter(values.values())).new_zeros(())
        out = []
        for layer in self.gated:
            i = self._branch_of[id(layer)]
            value = self._branch(i, values, exact, flops, like)
            if fraction:
                dense = self.branches[i][1].dense_flops if flops else self.branches[i][1].dense
                value = value / dense
            out.append(value)
        if exact:
            return {name: float(v) for name, v in zip(self.names, out, strict=True)}
        return torch.stack(out)

    # ------------------------------------------------------------------ public
    def parameters(self, kind="expected", per_layer=False):
        r"""Parameters the pruned model keeps: ``"expected"`` under :math:`q` (a differentiable 0-d tensor, or
        ``(L,)`` per layer), ``"test"`` with the Eq. 13 gates (a float, equal to ``count_parameters(prune(net))``)."""
        return self._measure("parameters", kind, per_layer, fraction=False)

    def flops(self, kind="expected", per_layer=False):
        """FLOPs per token of the pruned model (as :func:`flops_per_token` counts them), as :meth:`parameters`."""
        return self._measure("flops", kind, per_layer, fraction=False)

    def fraction(self, what="parameters", kind="expected", per_layer=False):
        """:meth:`parameters` or :meth:`flops` over the dense model's (``per_layer``: over each branch's own)."""
        return self._measure(what, kind, per_layer, fraction=True)

    def fraction_at(self, values, what="parameters", per_layer=False):
        """The pruned model's fractions (a list) for given 0/1 gate values ``{id(gated layer): float64 tensor}``."""
        out = self._measure(what, "test", per_layer, fraction=True, values=values)
        return list(out.values()) if per_layer else [out]
