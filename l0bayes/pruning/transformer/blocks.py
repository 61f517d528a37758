"""Which modules of a transformer block are its attention, projections and MLP: :class:`Block` and its resolution."""

from dataclasses import dataclass

from torch import nn

from ...nn.gates import HardConcreteGate

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
