"""Attention and encoder layers computed step by step (the gates reach their projections), and their pruned forms."""

import math

import torch
import torch.nn.functional as F
from torch import nn


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
    """A removed residual branch: zeros shaped like its input, with ``features`` in the last dimension when given (a
    pair ``(zeros, None)`` for an attention module that returns one, as ``nn.MultiheadAttention`` and Hugging
    Face's attentions, ``(attn_output, attn_weights)``, do).

    It accepts any call of the module it replaces: the input is the first positional argument or, for a module
    called by keyword (Hugging Face's Llama and OPT layers call ``self_attn(hidden_states=...)``), the first of
    the keywords ``hidden_states``, ``query``, ``x``, ``input``, ``src``, ``tgt``; with ``batch_first=False`` (an
    ``nn.MultiheadAttention``) the zeros take the query's shape, which is the output's in either layout.
    """

    #: Keywords a replaced module's input may be passed by, in the order they are looked for.
    INPUT_KEYWORDS = ("hidden_states", "query", "x", "input", "src", "tgt")

    def __init__(self, pair=False, batch_first=False, features=None):
        super().__init__()
        self.pair, self.batch_first = bool(pair), bool(batch_first)
        self.features = None if features is None else int(features)

    def extra_repr(self):
        return f"pair={self.pair}" + ("" if self.features is None else f", features={self.features}")

    def forward(self, *args, **kwargs):
        x = args[0] if args else next((kwargs[k] for k in self.INPUT_KEYWORDS if torch.is_tensor(kwargs.get(k))), None)
        if x is None:
            raise TypeError(
                f"ZeroBranch: called with no tensor input (positional or one of {list(self.INPUT_KEYWORDS)}); "
                f"got keywords {sorted(kwargs)}"
            )
        if self.features is None:
            zeros = torch.zeros_like(x)
        else:
            zeros = x.new_zeros((*x.shape[:-1], self.features))
        return (zeros, None) if self.pair else zeros


def _encoder_forward(
    layer, src, src_mask, src_key_padding_mask, is_causal, z_attention, z_mlp, feed_forward=True, observed=((), ())
):
    """``nn.TransformerEncoderLayer``'s slow path, with the branches scaled by ``z_attention`` / ``z_mlp``.

    ``observed``: the gates of each branch (attention, MLP) whose observer sees the branch's output before its gates.
    """
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
        for gate in observed[0]:
            gate.observer(out, None, None)
        return out if z_attention is None else out * z_attention.to(out.dtype)

    def mlp(x):
        out = layer.dropout2(layer.linear2(layer.dropout(layer.activation(layer.linear1(x)))))
        for gate in observed[1]:
            gate.observer(out, None, None)
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
        holders = [getattr(self, key, None) for key in ("l0_attention", "l0_mlp", "l0_block")]
        z_a = holders[0].gate() if holders[0] is not None else None
        z_m = holders[1].gate() if holders[1] is not None else None
        if holders[2] is not None:  # the block gate multiplies both branches
            z_b = holders[2].value()
            z_a = z_b if z_a is None else z_a * z_b
            z_m = z_b if z_m is None else z_m * z_b
        observed = ((), ())
        if any(h is not None and h.gate.observer is not None for h in holders):
            a, m, b = (h.gate if h is not None and h.gate.observer is not None else None for h in holders)
            # a branch's output is seen by its own gate and by the block gate
            observed = (tuple(g for g in (a, b) if g is not None), tuple(g for g in (m, b) if g is not None))
        return _encoder_forward(self, src, src_mask, src_key_padding_mask, is_causal, z_a, z_m, observed=observed)


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
