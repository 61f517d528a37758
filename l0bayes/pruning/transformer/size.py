"""What a pruned transformer keeps: :func:`flops_per_token` and :class:`TransformerSize`."""

import math

import torch
from torch import nn

from ...nn.density import density_names
from ...nn.gates import gate_owners, gate_parameter_ids
from ..counting import count_parameters
from ..hooks import as_input_tuple, probe_forward
from .attach import is_transformer_gated
from .blocks import _attention_modules, _attentions, _head_groups, _mlp_modules, _own_parameters, _unit_groups
from .projections import features, is_projection
from .projections import flops as projection_flops


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
        if is_projection(m) and not isinstance(m, nn.modules.linear.NonDynamicallyQuantizableLinear)
    ]
    for m in module.modules():
        if isinstance(m, nn.MultiheadAttention):
            hooks.append(m.register_forward_hook(mha_hook, with_kwargs=True))
            hooks.append(m.out_proj.register_forward_hook(linear_hook))
    inputs = as_input_tuple(example_inputs)
    probe_forward(module, inputs, hooks)
    return calls, _tokens(inputs)


def flops_per_token(module, example_inputs):
    """FLOPs per token of the linear layers in one forward pass, counted as :func:`~l0bayes.pruning.flops` counts.

    ``2 * in * out + out`` (the last term with a bias) per position of every ``nn.Linear`` (or Hugging Face
    ``Conv1D``) call (including the projections of an ``nn.MultiheadAttention``), divided by the tokens of the first
    input (its elements for token ids; its leading dimensions for embeddings). Attention's score and weighted-sum
    products, embeddings, normalisation and activations are not counted; gates count as their dense layers. A float.
    """
    calls, tokens = _linear_calls(module, example_inputs)
    return _flops(module, calls) / tokens


def _flops(module, calls):
    """The FLOPs of :func:`flops_per_token` for the call counts of :func:`_linear_calls` (not per token)."""
    total = 0
    for m in module.modules():
        if isinstance(m, nn.MultiheadAttention) and (id(m), "q") in calls:
            e = m.embed_dim
            for tag, dim in (("q", e), ("k", m.kdim), ("v", m.vdim)):
                total += (2 * dim * e + (e if m.in_proj_bias is not None else 0)) * calls[(id(m), tag)]
            if id(m.out_proj) not in calls:  # the fused path uses out_proj's weights without calling it
                out = m.out_proj
                total += (2 * e * e + (e if out.bias is not None else 0)) * calls[(id(m), "q")]
        if is_projection(m) and id(m) in calls:
            total += projection_flops(m) * calls[id(m)]
    return total


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
        self.branches = []  # [(branch gate or None, _BranchCount, block gate or None)]
        # [(block gate or None, [branch gates or None], parameters removed with the block, [branch indices])]: the
        # blocks prune() removes when all their branches close (their normalisation layers go with them)
        self.blocks = []
        self._branch_of = {}  # id(gated layer) -> index into branches, or ("block", index into blocks)
        inside = set()
        gate_params = gate_parameter_ids(net)
        for r in net._l0_transformer:
            block = net.get_submodule(r.name)
            first = len(self.branches)
            for att in _attentions(r):
                modules = _attention_modules(net, att)
                self._inside(inside, modules)
                count = self._attention_count(net, att, block, modules, per_token)
                self._add(block, att.branch_key, att.heads_key, count)
            modules = _mlp_modules(net, r)
            self._inside(inside, modules)
            self._add(block, "l0_mlp", "l0_units", self._mlp_count(net, r, block, modules, per_token))
            if r.removable:
                own = [p for p in block.parameters() if id(p) not in inside and id(p) not in gate_params]
                inside.update(id(p) for p in own)
                keys = [att.branch_key for att in _attentions(r)] + ["l0_mlp"]
                branch_gates = [getattr(block, key, None) for key in keys]
                holder = getattr(block, "l0_block", None)
                if holder is not None:
                    self._branch_of[id(holder)] = ("block", len(self.blocks))
                indices = list(range(first, len(self.branches)))
                self.blocks.append((holder, branch_gates, sum(p.numel() for p in own), indices))
        self.const = sum(p.numel() for p in net.parameters() if id(p) not in inside and id(p) not in gate_params)
        # the rest: every linear layer outside the branches (an output head, ungated blocks, ...)
        self.const_flops = _flops(net, calls) / tokens - sum(c.dense_flops for _, c, _ in self.branches)
        removable = sum(b[2] for b in self.blocks)
        self.dense_parameters = self.const + removable + sum(c.dense for _, c, _ in self.branches)
        self.dense_flops = self.const_flops + sum(c.dense_flops for _, c, _ in self.branches)
        assert self.dense_parameters == count_parameters(net), "the branches do not cover the model's parameters"

    @staticmethod
    def _inside(inside, modules):
        for m in modules:
            inside.update(id(p) for p in m.parameters())
            inside.update(id(s) for s in m.modules())

    def _add(self, block, branch_key, inner_key, count):
        index = len(self.branches)
        self.branches.append((getattr(block, branch_key, None), count, getattr(block, "l0_block", None)))
        for key in (branch_key, inner_key):
            holder = getattr(block, key, None)
            if holder is not None:
                self._branch_of[id(holder)] = index

    @staticmethod
    def _attention_count(net, r, block, modules, per_token):
        d, h = r.head_dim, r.groups  # one gate per key-value group (per head without grouped-query attention)
        _, per_head = _head_groups(net, r)
        total = _own_parameters(modules)
        const = total - per_head * h
        att = net.get_submodule(r.attention)
        out = net.get_submodule(r.out)
        if r.kind == "linear":
            # the outputs of one gate: q_width of q, d of k and of v (the same projection three times if fused)
            widths = (d, d, d) if r.fused else (r.q_width, d, d)
            projections = [(net.get_submodule(n), w) for n, w in zip((r.q, r.k, r.v), widths, strict=True)]
            per_flops = sum(
                (2 * features(m)[0] + (m.bias is not None)) * w * per_token.get(id(m), 0.0) for m, w in projections
            )
        else:
            bias = att.in_proj_bias is not None
            dims = {"q": att.embed_dim, "k": att.kdim, "v": att.vdim}
            per_flops = sum((2 * dims[t] + bias) * d * per_token.get((id(att), t), 0.0) for t in "qkv")
        pos = per_token.get(id(out), 0.0)
        per_flops += 2 * r.q_width * features(out)[1] * pos
        const_flops = (out.bias is not None) * features(out)[1] * pos
        return _BranchCount(getattr(block, r.heads_key, None), h, const, per_head, const_flops, per_flops)

    @staticmethod
    def _mlp_count(net, r, block, modules, per_token):
        _, per_unit = _unit_groups(net, r)
        down = net.get_submodule(r.down)
        width, n_out = features(down)
        const = _own_parameters(modules) - per_unit * width
        per_flops = 2 * n_out * per_token.get(id(down), 0.0)
        ups = [net.get_submodule(n) for n in r.up]
        per_flops += sum((2 * features(m)[0] + (m.bias is not None)) * per_token.get(id(m), 0.0) for m in ups)
        const_flops = (down.bias is not None) * n_out * per_token.get(id(down), 0.0)
        skip = {id(down), *(id(m) for m in ups)}
        for module in modules:  # other linear layers inside the MLP module
            for m in module.modules():
                if is_projection(m) and id(m) not in skip and id(m) in per_token:
                    const_flops += projection_flops(m) * per_token[id(m)]
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
        gate, count, block_gate = self.branches[index]
        value = count.count(values, exact, flops, like)
        for g in (gate, block_gate):
            if g is not None:
                value = value * values[id(g)].to(like).sum()
        return value

    def _block_rest(self, index, values, flops, like):
        r"""A removable block's own parameters (its norms): kept unless the block gate or every branch closes,
        :math:`c_n\, z_b \big(1 - \prod_i (1 - z_i)\big)` (a branch without a gate counts as open). Independent gates
        under :math:`q`: the same formula in expectation. No FLOPs (normalisation is not counted)."""
        holder, branch_gates, own, _ = self.blocks[index]
        if flops or own == 0:
            return like
        all_closed = like + 1.0
        for g in branch_gates:
            all_closed = all_closed * (0.0 if g is None else 1.0 - values[id(g)].to(like).sum())
        kept = 1.0 - all_closed
        if holder is not None:
            kept = kept * values[id(holder)].to(like).sum()
        return own * kept

    def _block(self, index, values, exact, flops, like):
        """All that block ``index`` of :attr:`blocks` keeps: its branches and its own parameters."""
        total = self._block_rest(index, values, flops, like)
        for i in self.blocks[index][3]:
            total = total + self._branch(i, values, exact, flops, like)
        return total

    def _dense_block(self, index, flops):
        _, _, own, indices = self.blocks[index]
        branches = [self.branches[i][1] for i in indices]
        return sum(c.dense_flops for c in branches) if flops else own + sum(c.dense for c in branches)

    def _count(self, values, exact, flops):
        like = next(iter(values.values())).new_zeros(())
        total = like + (self.const_flops if flops else self.const)
        for i in range(len(self.branches)):
            total = total + self._branch(i, values, exact, flops, like)
        for i in range(len(self.blocks)):
            total = total + self._block_rest(i, values, flops, like)
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
            if isinstance(i, tuple):  # a block gate: the whole block
                value = self._block(i[1], values, exact, flops, like)
                dense = self._dense_block(i[1], flops)
            else:
                value = self._branch(i, values, exact, flops, like)
                dense = self.branches[i][1].dense_flops if flops else self.branches[i][1].dense
            if fraction:
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
