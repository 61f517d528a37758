"""Which modules of a transformer block are its attention, projections and MLP: :class:`Block` and its resolution."""

from dataclasses import dataclass, replace

from torch import nn

from ...nn.gates import gate_parameter_ids
from .projections import features, is_projection, out_dim

#: Default names, searched in this order, of a block's attention module, its projections and head count,
#: and of its MLP module and layers.
ATTENTION_NAMES = ("attn", "attention", "self_attn", "self_attention", "mha")
Q_NAMES = ("q_proj", "query", "q", "wq", "q_lin")
K_NAMES = ("k_proj", "key", "k", "wk", "k_lin")
V_NAMES = ("v_proj", "value", "v", "wv", "v_lin")
QKV_NAMES = ("c_attn", "qkv", "qkv_proj", "Wqkv", "to_qkv", "query_key_value")
#: Fused projections whose outputs are q, k, v interleaved head by head (``(heads, 3, head_dim)``, GPT-NeoX).
PER_HEAD_QKV_NAMES = ("query_key_value",)
OUT_NAMES = ("out_proj", "o_proj", "out", "proj", "c_proj", "wo", "dense", "out_lin")
HEADS_ATTRS = ("num_heads", "n_head", "n_heads", "num_attention_heads", "heads")
MLP_NAMES = ("mlp", "ffn", "feed_forward", "ff", "ffwd")
UP_NAMES = ("fc1", "c_fc", "gate_proj", "up_proj", "w1", "w3", "lin1", "fc_in", "linear1", "dense_h_to_4h")
DOWN_NAMES = ("fc2", "c_proj", "down_proj", "w2", "lin2", "fc_out", "linear2", "proj", "dense_4h_to_h")


@dataclass
class Block:
    """One transformer block to gate: the ``blocks`` argument of :func:`sparsify_transformer`.

    Names are relative: ``attention`` and ``mlp`` to the block (``""``: the block itself), the projections and
    ``heads_attr`` to the attention module, ``up`` and ``down`` to the MLP module; dotted names reach further down.
    ``None`` searches the defaults (:data:`ATTENTION_NAMES`, :data:`Q_NAMES`, ...). An
    ``nn.TransformerEncoderLayer`` or an ``nn.TransformerDecoderLayer`` (its cross-attention has gates
    ``l0_cross_heads`` and ``l0_cross_attention`` of its own) needs only its ``name``; so do Hugging Face's GPT-2
    blocks (a fused ``c_attn`` of ``Conv1D`` layers) and BERT-style layers (``attention.self`` with ``query``,
    ``key``, ``value``; ``attention.output.dense``; ``intermediate.dense``; ``output.dense``; the residual addition
    and normalisation inside the output modules, so ``branch_output="projection"``).

    A projection is an ``nn.Linear`` or Hugging Face's ``Conv1D`` (a linear layer storing its weight
    ``(in, out)``).

    :param name: the block (qualified name as in :meth:`torch.nn.Module.named_modules`).
    :param attention: the attention module: an ``nn.MultiheadAttention``, or a module with ``q``, ``k``,
        ``v`` (or one fused ``qkv``) and ``out`` projections whose forward splits the projections into
        ``num_heads`` heads of equal width (head-major, as GPT-2 and BERT do) and reads the head count from
        the attribute ``heads_attr`` (which :func:`prune_transformer` lowers, with ``all_head_size`` and
        ``split_size`` where the module has them) or infers it from the width.
    :param qkv: one projection computing q, k and v, concatenated in that order (GPT-2's ``c_attn``).
    :param num_heads: the number of (query) heads; default: the attribute ``heads_attr``, else the attention's
        ``config.num_attention_heads`` (Hugging Face's Llama, Qwen2, Mistral, GPT-NeoX, whose forward infers the
        head count from the projections' width).
    :param num_kv_heads: the number of key-value heads (grouped-query attention: ``k`` and ``v`` have
        ``num_kv_heads * head_dim`` outputs, and query heads ``g * m, ..., g * m + m - 1`` with
        ``m = num_heads // num_kv_heads`` read key-value head ``g``); default: the attention's
        ``num_key_value_heads`` attribute or config entry, else ``num_heads``. Then one head gate per key-value
        group: it removes the group's ``m`` query heads and its key-value head together, so that every pruned
        layer keeps ``m`` query heads per key-value head (a valid grouped-query layout).
    :param qkv_layout: how a fused ``qkv`` projection orders its outputs: ``"concatenated"`` (all q, then all k,
        then all v: GPT-2's ``c_attn``) or ``"per_head"`` (q, k, v of head 0, then of head 1, ...: GPT-NeoX's
        ``query_key_value``); default: ``"per_head"`` for a projection named ``query_key_value``.
    :param mlp: the MLP module (``""``: the block itself; its branch's output is then the ``down`` projection's,
        as in ``nn.TransformerDecoderLayer``). Its ``up`` layers (one, or several read element-wise
        together, as a gated linear unit) feed, through element-wise operations, its ``down`` layer.
    :param branch_output: where a residual branch's output is, for its :class:`LayerGate`: ``"module"``
        (default: the attention and MLP modules' outputs, what the block adds to the residual stream) or
        ``"projection"`` (the ``out`` and ``down`` projections' outputs, for blocks that add and normalise
        inside the module holding the projection, as BERT does: ``norm(x + z f(x))``). With
        ``"projection"``, ``q``, ``k``, ``v`` live in a module of their own (the owner of ``heads_attr``),
        which a closed branch replaces by a :class:`ZeroBranch` together with ``out``.
    """

    name: str
    attention: str | None = None
    q: str | None = None
    k: str | None = None
    v: str | None = None
    qkv: str | None = None
    out: str | None = None
    num_heads: int | None = None
    heads_attr: str | None = None
    mlp: str | None = None
    up: str | list | None = None
    down: str | None = None
    branch_output: str | None = None
    num_kv_heads: int | None = None
    qkv_layout: str | None = None


#: The layout of a BERT-style layer (Hugging Face's BERT, RoBERTa, ...), relative to the layer.
POST_NORM_LAYOUT = {
    "attention": "attention",
    "q": "self.query",
    "k": "self.key",
    "v": "self.value",
    "out": "output.dense",
    "heads_attr": "self.num_attention_heads",
    "mlp": "",
    "up": "intermediate.dense",
    "down": "output.dense",
    "branch_output": "projection",
}


@dataclass
class _Resolved:
    """A :class:`Block` with absolute names, its kind (``"encoder"``, ``"linear"``, ``"mha"``) and head shapes.

    ``fused``: ``q``, ``k`` and ``v`` name one projection (q, k, v concatenated). ``outputs``: the attention
    module returns a tensor (0) or a tuple of that length (filled in by :func:`sparsify_transformer`'s probe).
    """

    name: str
    kind: str
    attention: str
    q: str | None
    k: str | None
    v: str | None
    out: str
    num_heads: int
    head_dim: int
    heads_owner: str | None
    heads_attr: str | None
    mlp: str | None
    up: list
    down: str
    fused: bool = False
    branch_output: str = "module"
    outputs: int = 0
    heads_key: str = "l0_heads"
    branch_key: str = "l0_attention"
    cross: "_Resolved | None" = None  # a decoder layer's cross-attention (its own head and branch gates)
    kv_heads: int = 0  # key-value heads (0: as many as query heads)
    qkv_layout: str = "concatenated"  # of a fused projection: "concatenated" or "per_head"
    removable: bool = False  # the identity with its branches closed, in a ModuleList: prune() removes it then

    @property
    def groups(self):
        """The head gates: one per key-value group (one per head without grouped-query attention)."""
        return self.kv_heads or self.num_heads

    @property
    def q_width(self):
        """The query (and output-projection input) features of one key-value group."""
        return self.num_heads // self.groups * self.head_dim

    @property
    def mlp_at_projection(self):
        """Whether the MLP branch's output is its down projection's (the MLP is no module of its own, or the block
        adds and normalises inside the module holding the projection)."""
        return self.branch_output == "projection" or self.mlp == self.name


def _join(*parts):
    return ".".join(p for p in parts if p)


def _first(module, names, what, where):
    for n in names:
        if isinstance(getattr(module, n, None), nn.Module):
            return n
    raise ValueError(f"{where}: no {what} among the default names {list(names)}; name it in Block(...)")


def _projection(model, name, what):
    try:
        m = model.get_submodule(name)
    except AttributeError:
        raise ValueError(f"{what}: no module named {name!r} in the model") from None
    if not is_projection(m):
        raise TypeError(f"{what} {name!r} must be an nn.Linear (or Hugging Face's Conv1D), got {type(m).__name__}")
    return m


def _has(module, path):
    for part in path.split("."):
        module = getattr(module, part, None)
        if not isinstance(module, nn.Module):
            return False
    return True


def is_post_norm_layer(module):
    """Whether ``module`` has the layout :data:`POST_NORM_LAYOUT` (a BERT-style layer)."""
    paths = ("attention.self", "attention.output.dense", "intermediate.dense", "output.dense")
    return all(_has(module, p) for p in paths)


def _resolve(model, block):
    """The :class:`_Resolved` of one block (a name or a :class:`Block`); ValueErrors naming what is missing."""
    block = Block(block) if isinstance(block, str) else block
    try:
        module = model.get_submodule(block.name)
    except AttributeError:
        raise ValueError(f"blocks: no module named {block.name!r} in the model") from None
    if isinstance(module, nn.TransformerDecoderLayer):  # self- and cross-attention heads, MLP units, 3 branches
        mha, cross = module.self_attn, module.multihead_attn
        _check_mha(mha, _join(block.name, "self_attn"))
        _check_mha(cross, _join(block.name, "multihead_attn"))
        cross = _Resolved(
            block.name, "mha", _join(block.name, "multihead_attn"), None, None, None,
            _join(block.name, "multihead_attn", "out_proj"), cross.num_heads, cross.head_dim, None, None, None, [],
            None, heads_key="l0_cross_heads", branch_key="l0_cross_attention",
        )  # fmt: skip
        return _Resolved(
            block.name, "mha", _join(block.name, "self_attn"), None, None, None,
            _join(block.name, "self_attn", "out_proj"), mha.num_heads, mha.head_dim, None, None, block.name,
            [_join(block.name, "linear1")], _join(block.name, "linear2"), cross=cross,
        )  # fmt: skip
    if isinstance(module, nn.TransformerEncoderLayer):
        mha = module.self_attn
        _check_mha(mha, _join(block.name, "self_attn"))
        return _Resolved(
            block.name, "encoder", _join(block.name, "self_attn"), None, None, None,
            _join(block.name, "self_attn", "out_proj"), mha.num_heads, mha.head_dim, None, None, None,
            [_join(block.name, "linear1")], _join(block.name, "linear2"),
        )  # fmt: skip
    if block.attention is None and block.mlp is None and is_post_norm_layer(module):
        given = {k: getattr(block, k) for k in POST_NORM_LAYOUT if getattr(block, k) is not None}
        block = replace(block, **{**POST_NORM_LAYOUT, **given})
    branch_output = block.branch_output or "module"
    if branch_output not in ("module", "projection"):
        raise ValueError(f"{block.name}: branch_output must be 'module' or 'projection', got {block.branch_output!r}")
    att_rel = (
        block.attention if block.attention is not None else _first(module, ATTENTION_NAMES, "attention", block.name)
    )
    attention = _join(block.name, att_rel)
    att = model.get_submodule(attention)
    mlp_rel = block.mlp
    if mlp_rel is None:
        mlp_rel = "" if _has_own_mlp_layers(module) else _first(module, MLP_NAMES, "MLP module", block.name)
    mlp = _join(block.name, mlp_rel)
    mlp_module = model.get_submodule(mlp)
    up, down = _resolve_mlp(model, block, mlp, mlp_module)
    if isinstance(att, nn.MultiheadAttention):
        _check_mha(att, attention)
        return _Resolved(
            block.name, "mha", attention, None, None, None, _join(attention, "out_proj"),
            att.num_heads, att.head_dim, None, None, mlp, up, down, branch_output=branch_output,
        )  # fmt: skip
    names, fused = _resolve_projections(model, block, attention, att)
    owner, attr, num_heads, kv_heads = _resolve_heads(model, block, attention, att)
    layout = _qkv_layout(block, names["q"]) if fused else "concatenated"
    qkv = model.get_submodule(names["q"])
    n_out = features(qkv)[1]
    if fused and kv_heads != num_heads:
        raise ValueError(
            f"{names['q']}: a fused qkv projection with grouped-query attention ({num_heads} query heads, "
            f"{kv_heads} key-value heads) is not supported; name separate q, k and v projections"
        )
    width = n_out // (3 if fused else 1)
    if fused and n_out % 3:
        raise ValueError(f"{names['q']}: {n_out} outputs do not split into q, k and v")
    if num_heads <= 0 or width % num_heads:
        raise ValueError(f"{attention}: {width} query features do not split into num_heads={num_heads} heads")
    if kv_heads <= 0 or num_heads % kv_heads:
        raise ValueError(
            f"{attention}: num_kv_heads={kv_heads} must divide num_heads={num_heads} (grouped-query attention)"
        )
    head_dim = width // num_heads
    for key in ("k", "v"):
        expected = width * 3 if fused else kv_heads * head_dim
        got = features(model.get_submodule(names[key]))[1]
        if got != expected:
            raise ValueError(
                f"{names[key]} has {got} outputs, expected {expected} ({kv_heads} key-value heads of {head_dim} "
                f"features; q has {width}): name num_kv_heads= in Block(...) if it differs"
            )
    if features(model.get_submodule(names["out"]))[0] != width:
        inputs = features(model.get_submodule(names["out"]))[0]
        raise ValueError(f"{names['out']} has {inputs} inputs, q {width} outputs")
    if branch_output == "projection":
        inside = all(names[k].startswith(owner + ".") for k in "qkv") and not names["out"].startswith(owner + ".")
        if owner == attention or not inside:
            raise ValueError(
                f"{block.name}: branch_output='projection' needs q, k and v in a module of their own, the owner of "
                f"heads_attr (BERT's attention.self), apart from the output projection {names['out']}"
            )
    return _Resolved(
        block.name, "linear", attention, names["q"], names["k"], names["v"], names["out"], num_heads,
        head_dim, owner, attr, mlp, up, down, fused=fused, branch_output=branch_output,
        kv_heads=kv_heads if kv_heads != num_heads else 0, qkv_layout=layout,
    )  # fmt: skip


def _qkv_layout(block, name):
    layout = block.qkv_layout
    if layout is None:
        layout = "per_head" if name.rpartition(".")[2] in PER_HEAD_QKV_NAMES else "concatenated"
    if layout not in ("concatenated", "per_head"):
        raise ValueError(f"{block.name}: qkv_layout must be 'concatenated' or 'per_head', got {layout!r}")
    return layout


def _resolve_mlp(model, block, mlp, mlp_module):
    """Absolute names of the MLP's up layers and its down layer, checked."""
    ups = block.up
    if ups is None:
        ups = [n for n in UP_NAMES if is_projection(getattr(mlp_module, n, None))]
    ups = [ups] if isinstance(ups, str) else list(ups)
    down_rel = block.down or _first(mlp_module, [n for n in DOWN_NAMES if n not in ups], "second (down) MLP layer", mlp)
    if not ups:
        raise ValueError(f"{mlp}: no first (up) MLP layer among the default names {list(UP_NAMES)}; name it")
    up = [_join(mlp, u) for u in ups]
    down = _join(mlp, down_rel)
    width = features(_projection(model, down, "down"))[0]
    for name in up:
        if features(_projection(model, name, "up"))[1] != width:
            raise ValueError(f"{name} has {features(model.get_submodule(name))[1]} outputs, {down} {width} inputs")
    return up, down


def _resolve_projections(model, block, attention, att):
    """``({"q", "k", "v", "out": absolute name}, fused)``: separate q/k/v projections, or one fused ``qkv``."""
    fused = block.qkv is not None
    if not fused and block.q is None and not any(_has(att, n) for n in Q_NAMES):
        if any(_has(att, n) for n in QKV_NAMES):
            fused = True
    names = {}
    if fused:
        rel = block.qkv or _first(att, QKV_NAMES, "fused qkv projection", attention)
        names["q"] = names["k"] = names["v"] = _join(attention, rel)
        _projection(model, names["q"], "qkv")
    else:
        for key, defaults in (("q", Q_NAMES), ("k", K_NAMES), ("v", V_NAMES)):
            rel = getattr(block, key) or _first(att, defaults, f"{key} projection", attention)
            names[key] = _join(attention, rel)
            _projection(model, names[key], key)
    names["out"] = _join(attention, block.out or _first(att, OUT_NAMES, "out projection", attention))
    _projection(model, names["out"], "out")
    return names, fused


def _config_int(att, key):
    value = getattr(getattr(att, "config", None), key, None)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _resolve_heads(model, block, attention, att):
    """``(owner module name, attribute or None, head count, key-value head count)``: where the attention reads
    its head count (``None``: it infers it from the projections' width, as Hugging Face's Llama does)."""
    for key in ("num_heads", "num_kv_heads"):
        value = getattr(block, key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value <= 0):
            raise ValueError(f"{block.name}: {key} must be a positive int, got {value!r}")
    heads_attr = block.heads_attr
    if heads_attr is None:
        heads_attr = next((a for a in HEADS_ATTRS if _is_int(getattr(att, a, None))), None)
    kv_heads = block.num_kv_heads
    if kv_heads is None:
        kv_heads = getattr(att, "num_key_value_heads", None)
        kv_heads = kv_heads if _is_int(kv_heads) else _config_int(att, "num_key_value_heads")
    if heads_attr is None:
        num_heads = block.num_heads if block.num_heads is not None else _config_int(att, "num_attention_heads")
        if num_heads is None:
            raise ValueError(
                f"{attention}: the head count is read from an int attribute of the attention module "
                f"(one of {list(HEADS_ATTRS)}, or heads_attr=...), which prune() lowers, or from its "
                "config.num_attention_heads; none found: name num_heads= and heads_attr= in Block(...)"
            )
        return attention, None, num_heads, kv_heads if kv_heads is not None else num_heads
    owner_rel, _, attr = heads_attr.rpartition(".")
    owner = _join(attention, owner_rel)
    try:
        owner_module = model.get_submodule(owner)
    except AttributeError:
        raise ValueError(f"heads_attr {heads_attr!r}: no module {owner!r}") from None
    num_heads = block.num_heads if block.num_heads is not None else getattr(owner_module, attr, None)
    if not _is_int(getattr(owner_module, attr, None)) or not _is_int(num_heads):
        raise ValueError(f"{owner}: no int attribute {attr!r} (the head count, which prune() lowers)")
    return owner, attr, num_heads, kv_heads if kv_heads is not None else num_heads


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _check_mha(mha, name):
    if mha.bias_k is not None or mha.add_zero_attn:
        raise NotImplementedError(f"{name}: add_bias_kv and add_zero_attn are not supported")


def _has_own_mlp_layers(module):
    """Whether ``module`` holds its MLP's up and down projections itself (OPT's decoder layer: ``fc1``, ``fc2``)."""
    ups = [n for n in UP_NAMES if is_projection(getattr(module, n, None))]
    return bool(ups) and any(is_projection(getattr(module, n, None)) for n in DOWN_NAMES if n not in ups)


def _is_relative_bias_block(module):
    """A T5-style block: its attention holds a relative position bias with one column per head, shared by the
    stack's later layers."""
    layers = getattr(module, "layer", None)
    first = layers[0] if isinstance(layers, nn.ModuleList) and len(layers) else None
    return first is not None and isinstance(getattr(first, "SelfAttention", None), nn.Module)


def _auto_blocks(model):
    """Every ``nn.TransformerEncoderLayer`` and ``nn.TransformerDecoderLayer``, every BERT-style layer and every
    module with a default attention child and an MLP (a child of a default name, or its own up and down
    projections)."""
    out = []
    for name, m in model.named_modules():
        if isinstance(m, (nn.TransformerEncoderLayer, nn.TransformerDecoderLayer)) or is_post_norm_layer(m):
            out.append(name)
        elif _is_relative_bias_block(m):
            raise ValueError(
                f"{name}: T5-style blocks are not supported (the relative position bias of the first layer has a "
                "column per head and is shared by the later layers, and the attention returns it with its output); "
                "gate the model's linear layers with sparsify() instead"
            )
        elif any(isinstance(getattr(m, a, None), nn.Module) for a in ATTENTION_NAMES) and (
            any(isinstance(getattr(m, a, None), nn.Module) for a in MLP_NAMES) or _has_own_mlp_layers(m)
        ):
            out.append(name)
    return out


def _set(model, name, module):
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, module)


def _head_groups(model, r):
    """``[(module, parameter, dim, width)]`` of the parameters one head owns, and the parameters per head."""
    d = r.head_dim
    if r.kind == "linear":
        groups = []
        if r.fused and r.qkv_layout == "per_head":  # q, k, v of one head side by side
            m = model.get_submodule(r.q)
            groups += [(m, "weight", out_dim(m), 3 * d), (m, "bias", 0, 3 * d)]
        elif r.fused:
            m = model.get_submodule(r.q)
            dim, width = out_dim(m), r.num_heads * d
            for i in range(3):
                groups.append((_SliceView(m, "weight", dim, i * width, width), "value", dim, d))
                groups.append((_SliceView(m, "bias", 0, i * width, width), "value", 0, d))
        else:  # one key-value group: m query heads, one key head, one value head
            for name, width in ((r.q, r.q_width), (r.k, d), (r.v, d)):
                m = model.get_submodule(name)
                groups += [(m, "weight", out_dim(m), width), (m, "bias", 0, width)]
        out = model.get_submodule(r.out)
        groups.append((out, "weight", 1 - out_dim(out), r.q_width))
    else:
        mha = model.get_submodule(r.attention)
        e = mha.embed_dim
        if mha._qkv_same_embed_dim:
            groups = [(_SliceView(mha, "in_proj_weight", 0, i * e, e), "value", 0, d) for i in range(3)]
        else:
            groups = [(mha, a, 0, d) for a in ("q_proj_weight", "k_proj_weight", "v_proj_weight")]
        if mha.in_proj_bias is not None:
            groups += [(_SliceView(mha, "in_proj_bias", 0, i * e, e), "value", 0, d) for i in range(3)]
        groups.append((mha.out_proj, "weight", 1, d))
    per_head = 0
    for module, attr, dim, width in groups:
        p = getattr(module, attr)
        if p is not None:
            per_head += p.numel() // (p.shape[dim] // width)
    return groups, per_head


class _SliceView:
    """``length`` entries from ``start`` along ``dim`` of a module's parameter (one of q, k, v in a packed
    projection), read on access; ``None`` where the module has no such parameter."""

    def __init__(self, module, attr, dim, start, length):
        self.module, self.attr, self.dim, self.start, self.length = module, attr, dim, start, length

    @property
    def value(self):
        p = getattr(self.module, self.attr)
        return None if p is None else p.narrow(self.dim, self.start, self.length)


def _unit_groups(model, r):
    groups = []
    per_unit = 0
    for name in r.up:
        m = model.get_submodule(name)
        groups += [(m, "weight", out_dim(m), 1), (m, "bias", 0, 1)]
        per_unit += features(m)[0] + (m.bias is not None)
    down = model.get_submodule(r.down)
    groups.append((down, "weight", 1 - out_dim(down), 1))
    return groups, per_unit + features(down)[1]


def _attention_modules(model, r):
    """The modules a closed attention branch removes."""
    if r.branch_output == "projection":
        return [model.get_submodule(r.heads_owner), model.get_submodule(r.out)]
    return [model.get_submodule(r.attention)]


def _mlp_modules(model, r):
    """The modules a closed MLP branch removes."""
    if r.kind == "encoder" or r.mlp_at_projection:
        return [model.get_submodule(n) for n in (*r.up, r.down)]
    return [model.get_submodule(r.mlp)]


def _attentions(r):
    """The attentions of block ``r``: its own, and a decoder layer's cross-attention."""
    return (r,) if r.cross is None else (r, r.cross)


def _own_parameters(modules):
    seen = set()
    total = 0
    for m in modules:
        gates = gate_parameter_ids(m)
        for p in m.parameters():
            if id(p) not in seen and id(p) not in gates:
                seen.add(id(p))
                total += p.numel()
    return total
