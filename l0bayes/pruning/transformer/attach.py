"""Attaching head, unit and branch gates to a transformer: :func:`sparsify_transformer`."""

import copy

import torch
from torch import nn

from ...nn.gates import check_gate_kwargs
from ..hooks import as_input_tuple, probe_forward
from ..sparsify import is_sparsified
from .attention import ZeroBranch, _ExplicitMultiheadAttention, _GatedTransformerEncoderLayer
from .blocks import (
    ATTENTION_NAMES,
    MLP_NAMES,
    Block,
    _attention_modules,
    _attentions,
    _auto_blocks,
    _head_groups,
    _mlp_modules,
    _own_parameters,
    _resolve,
    _unit_groups,
)
from .gates import BlockGate, HeadGate, LayerGate, UnitGate
from .projections import features


def sparsify_transformer(
    model,
    blocks=None,
    *,
    example_inputs,
    heads=True,
    units=True,
    layers=True,
    depth=False,
    may_remove_all=False,
    inplace=False,
    **gate_kwargs,
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
    :param bool depth: attach a :class:`BlockGate` ``l0_block`` to every block: one gate for the whole block
        (Sheared-LLaMA's layer mask), which a target architecture's ``num_hidden_layers`` trains. Every block must
        then be removable: the identity when its branches are closed (pre-norm, as Llama, GPT-2 and OPT's default
        are; a post-norm block such as BERT's normalises even then), and an entry of an ``nn.ModuleList`` or
        ``nn.Sequential``.
    :param bool may_remove_all: whether the final cut of the constrained objective may close the attention
        branch (or the MLP branch) of every block, and :func:`~l0bayes.pruning.prune` may remove them all without
        a warning. Default ``False``: the final cut keeps the best-scored branch of each kind open whatever the
        target, and ``prune`` warns when the gates close every one.
    :param inplace: modify ``model`` itself instead of a deep copy.
    :param gate_kwargs: ``init_drop_rate``, ``temperature``, ``lower``, ``upper``, ``init_std`` of every gate.
    :returns: the gated model, in the training mode ``model`` was in; its gates are listed by
        :func:`~l0bayes.nn.gates_of` as ``"<block>.l0_heads.gate"``, ``"<block>.l0_units.gate"``, ...
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    flags = (
        ("heads", heads),
        ("units", units),
        ("layers", layers),
        ("depth", depth),
        ("may_remove_all", may_remove_all),
        ("inplace", inplace),
    )
    for key, value in flags:
        if not isinstance(value, bool):
            raise TypeError(f"{key} must be True or False, got {value!r}")
    if not (heads or units or layers or depth):
        raise ValueError("heads, units, layers and depth are all False: nothing to gate")
    check_gate_kwargs("sparsify_transformer", gate_kwargs)
    example_inputs = check_example_inputs(example_inputs)
    if is_sparsified(model) or is_transformer_gated(model):
        raise ValueError("the model already has gates")
    names = _check_blocks(blocks)
    if not inplace:
        model = copy.deepcopy(model)
    names = _auto_blocks(model) if names is None else names
    if not names:
        raise ValueError(
            "no transformer block found by the default names (a module with an attention child such as "
            f"{list(ATTENTION_NAMES)} and an MLP child such as {list(MLP_NAMES)}, or its own up and down "
            "projections); name them with blocks=[...] or Block(...)"
        )
    resolved = [_resolve(model, b) for b in names]
    seen = set()
    for r in resolved:
        if r.name in seen:
            raise ValueError(f"block {r.name!r} named twice")
        seen.add(r.name)
    _probe_outputs(model, resolved, example_inputs, layers or depth)
    _probe_removable(model, resolved, example_inputs)
    if depth:
        fixed = [r.name for r in resolved if not r.removable]
        if fixed:
            raise ValueError(
                f"depth=True: block {fixed[0]!r} cannot be removed as a whole (it is not the identity when its "
                "branches are closed, as a post-norm block normalises its input even then, or it is no entry of an "
                "nn.ModuleList / nn.Sequential); gate it with depth=False (its branches may still close)"
            )
    for r in resolved:
        _attach_block(model, r, heads, units, layers, gate_kwargs, may_remove_all, depth)
    for m in model.modules():  # the nested-tensor fast path would skip the gates
        if isinstance(m, nn.TransformerEncoder):
            m.use_nested_tensor = False
    object.__setattr__(model, "_l0_transformer", resolved)
    object.__setattr__(model, "_l0_example_inputs", tuple(t[:1].detach().clone() for t in example_inputs))
    object.__setattr__(model, "_l0_may_remove_all", may_remove_all)
    return model


def check_example_inputs(example_inputs):
    """``example_inputs`` as a tuple of tensors, each with a batch dimension of at least one example.

    :raises TypeError: naming ``example_inputs`` (or its entry) for anything but a tensor or a tuple of tensors.
    :raises ValueError: naming ``example_inputs`` for a tensor without a batch dimension, or an empty tuple.
    """
    if example_inputs is None:
        raise ValueError("sparsify_transformer needs example_inputs (a batch the model accepts, e.g. token ids)")
    inputs = as_input_tuple(example_inputs)
    if not inputs:
        raise ValueError("example_inputs is an empty tuple; give a batch the model accepts, e.g. token ids")
    for i, t in enumerate(inputs):
        where = f"example_inputs[{i}]" if isinstance(example_inputs, tuple) else "example_inputs"
        if not torch.is_tensor(t):
            raise TypeError(
                f"{where} must be a tensor (example_inputs: a tensor or a tuple of tensors), got {type(t).__name__}"
            )
        if t.dim() == 0 or t.shape[0] == 0:
            raise ValueError(
                f"{where} must have a batch dimension with at least one example, got shape {tuple(t.shape)}"
            )
    return inputs


def _check_blocks(blocks):
    """``blocks`` as a list of names and :class:`Block` s (``None``: found by default)."""
    if blocks is None:
        return None
    if isinstance(blocks, (str, Block)):
        raise TypeError(
            f"blocks must be a list of block names or Block(...)s, got {blocks!r}: write blocks=[{blocks!r}]"
        )
    try:
        names = list(blocks)
    except TypeError:
        raise TypeError(f"blocks must be a list of block names or Block(...)s, got {type(blocks).__name__}") from None
    if not names:
        raise ValueError("blocks is empty; leave it None to gate every block found by the default names")
    for b in names:
        if not isinstance(b, (str, Block)):
            raise TypeError(f"blocks: every entry must be a block name (a str) or a Block(...), got {b!r}")
    return names


def _probe_outputs(model, resolved, inputs, layers):
    """Fill in each block's ``outputs`` (what a :class:`ZeroBranch` in its attention's place must return) by one
    forward pass; a ``ValueError`` where the model does not run on ``inputs``, or (with branch gates) where a gated
    module's output is neither a tensor nor a ``(tensor, ...)`` pair."""
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
    run_on_example_inputs(model, inputs, handles)
    for name, r in watched.items():
        if not layers:
            break
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


#: What a model's forward raises on inputs it does not accept (a float tensor of token ids, an id beyond the
#: vocabulary, a wrong shape).
FORWARD_ERRORS = (RuntimeError, TypeError, ValueError, IndexError, AttributeError)


def run_on_example_inputs(model, inputs, handles=(), shown=None):
    """``model``'s output on ``inputs`` (a tuple of tensors), one ``eval()``, no-grad forward (:func:`probe_forward`,
    which removes the hooks behind ``handles`` afterwards).

    :param shown: the example inputs as the user gave them, for the message (default ``inputs``).

    :raises ValueError: naming ``example_inputs`` where the model does not run on them.
    """
    seen = []
    handles = [*handles, model.register_forward_hook(lambda module, args, output: seen.append(output))]
    try:
        probe_forward(model, inputs, handles)
    except FORWARD_ERRORS as err:
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        shapes = [(tuple(t.shape), str(t.dtype).replace("torch.", "")) for t in (inputs if shown is None else shown)]
        raise ValueError(
            f"example_inputs: the model does not run on them ({type(err).__name__}: {first}); got {shapes}: give a "
            "batch the model accepts (e.g. a (batch, length) tensor of token ids)"
        ) from err
    return seen[-1]


def _attach_block(model, r, heads, units, layers, gate_kwargs, may_remove_all=False, depth=False):
    """The gates of one block, in the order heads, units, attention branch, MLP branch (then a decoder layer's
    cross-attention heads and branch): the order of :func:`~l0bayes.nn.gates_of`."""
    block = model.get_submodule(r.name)
    like = next((p for p in block.parameters() if p.is_floating_point()), None)
    if r.kind == "encoder":
        block.__class__ = _GatedTransformerEncoderLayer
    for att in _attentions(r):
        if att.kind in ("encoder", "mha"):
            model.get_submodule(att.attention).__class__ = _ExplicitMultiheadAttention
    if heads:
        _attach_heads(model, block, r, gate_kwargs, like)
    if units:
        groups, per_unit = _unit_groups(model, r)
        down = model.get_submodule(r.down)
        holder = _like(UnitGate(features(down)[0], per_unit, **gate_kwargs), like)
        holder._groups = groups
        block.l0_units = holder
        down.register_forward_pre_hook(holder._gate_units)
    if layers:
        keep = None if may_remove_all else "attention"
        _attach_attention_branch(model, block, r, gate_kwargs, like, keep)
        hooked = r.down if r.mlp_at_projection else r.mlp
        modules = _mlp_modules(model, r)
        keep = None if may_remove_all else "mlp"
        _attach_branch(model, block, "l0_mlp", modules, hooked, r.kind, gate_kwargs, like, keep)
    if r.cross is not None:
        if heads:
            _attach_heads(model, block, r.cross, gate_kwargs, like)
        if layers:
            keep = None if may_remove_all else "cross_attention"
            _attach_attention_branch(model, block, r.cross, gate_kwargs, like, keep)
    if depth:
        _attach_block_gate(model, block, r, gate_kwargs, like, None if may_remove_all else "block")


def _like(holder, like):
    """``holder`` on the device and in the floating dtype of the block's parameters ``like``."""
    return holder if like is None else holder.to(device=like.device, dtype=like.dtype)


def _attach_heads(model, block, r, gate_kwargs, like=None):
    groups, per_head = _head_groups(model, r)
    holder = _like(HeadGate(r.groups, r.q_width, per_head, **gate_kwargs), like)
    holder._groups = groups
    setattr(block, r.heads_key, holder)
    model.get_submodule(r.out).register_forward_pre_hook(holder._gate_heads)


def _attach_attention_branch(model, block, r, gate_kwargs, like=None, keep_one_of=None):
    hooked = r.out if r.branch_output == "projection" else r.attention
    modules = _attention_modules(model, r)
    _attach_branch(model, block, r.branch_key, modules, hooked, r.kind, gate_kwargs, like, keep_one_of)


def _attach_branch(model, block, key, modules, hooked, kind, gate_kwargs, like=None, keep_one_of=None):
    holder = _like(LayerGate(1, max(1, _own_parameters(modules)), keep_one_of=keep_one_of, **gate_kwargs), like)
    holder._groups = [(m, n, 0, 0) for m in modules for n, _ in m.named_parameters()]
    setattr(block, key, holder)
    if kind != "encoder":  # the encoder layer's forward calls its branch gates itself
        model.get_submodule(hooked).register_forward_hook(holder._gate_output)


def _branch_outputs(r):
    """The modules whose outputs are block ``r``'s branch outputs (where branch and block gates multiply)."""
    out = [att.out if att.branch_output == "projection" else att.attention for att in _attentions(r)]
    return [*out, r.down if r.mlp_at_projection else r.mlp]


def _attach_block_gate(model, block, r, gate_kwargs, like, keep_one_of):
    holder = _like(BlockGate(max(1, _own_parameters([block])), keep_one_of=keep_one_of, **gate_kwargs), like)
    holder._groups = [(block, n, 0, 0) for n, _ in block.named_parameters() if not n.startswith("l0_")]
    block.l0_block = holder
    block.register_forward_pre_hook(holder._draw)
    block.register_forward_hook(holder._release)
    if r.kind != "encoder":  # the encoder layer's forward reads its block gate itself
        for name in _branch_outputs(r):
            model.get_submodule(name).register_forward_hook(holder._gate_output)


def _probe_removable(model, resolved, inputs):
    """Set each block's ``removable``: an entry of an ``nn.ModuleList`` or ``nn.Sequential`` that returns its input
    (exactly) when the outputs of all its branches are zero, found by one forward pass with those outputs zeroed."""
    seen, handles = {}, []

    def zero(module, args, output):
        if isinstance(output, tuple):
            return (torch.zeros_like(output[0]), *output[1:])
        return torch.zeros_like(output)

    def record_input(name):
        def hook(module, args, kwargs):
            seen[name] = [_block_input(args, kwargs), None]

        return hook

    def record_output(name):
        def hook(module, args, output):
            if name in seen:
                seen[name][1] = output[0] if isinstance(output, tuple) and output else output

        return hook

    for r in resolved:
        parent = model.get_submodule(r.name.rpartition(".")[0]) if "." in r.name else None
        r.removable = False
        if r.kind == "encoder":
            r.removable = isinstance(parent, (nn.ModuleList, nn.Sequential)) and model.get_submodule(r.name).norm_first
            continue
        if not isinstance(parent, (nn.ModuleList, nn.Sequential)) or r.branch_output != "module":
            continue
        block = model.get_submodule(r.name)
        handles.append(block.register_forward_pre_hook(record_input(r.name), with_kwargs=True))
        handles.append(block.register_forward_hook(record_output(r.name)))
        handles += [model.get_submodule(n).register_forward_hook(zero) for n in _branch_outputs(r)]
    if not handles:
        return
    try:
        probe_forward(model, inputs, handles)
    except FORWARD_ERRORS:
        return  # the model does not run with its branches zeroed: no block is removed
    for r in resolved:
        x, y = seen.get(r.name, (None, None))
        if torch.is_tensor(x) and torch.is_tensor(y) and x.shape == y.shape and torch.equal(x, y):
            r.removable = True


def _block_input(args, kwargs):
    """The residual stream a block is called with: its first positional argument or input keyword."""
    if args:
        return args[0]
    return next((kwargs[k] for k in ZeroBranch.INPUT_KEYWORDS if torch.is_tensor(kwargs.get(k))), None)


def is_transformer_gated(module):
    """Whether ``module`` holds gates attached by :func:`sparsify_transformer`."""
    return getattr(module, "_l0_transformer", None) is not None
