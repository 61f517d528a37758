"""The gates of a transformer block: one per head, one per MLP unit, one per residual branch."""

from ...nn.gates import HardConcreteGate
from ...nn.layers import L0Layer


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
    viewed as ``(..., num_heads, head_dim)``. ``group_size``: the parameters of one head. With grouped-query
    attention a "head" here is a key-value group: ``num_heads`` is the number of key-value heads and ``head_dim``
    the query features of one group (its query heads side by side).
    """

    def __init__(self, num_heads, head_dim, group_size, **gate_kwargs):
        super().__init__(num_heads, group_size, **gate_kwargs)
        self.num_heads, self.head_dim = int(num_heads), int(head_dim)

    def extra_repr(self):
        return f"num_heads={self.num_heads}, head_dim={self.head_dim}"

    def _gate_heads(self, module, args):
        x = args[0].unflatten(-1, (self.num_heads, self.head_dim))
        gate = self.gate
        if gate.observer is not None:
            gate.observer(x, -2, module)
        y = x * gate().to(x.dtype).unsqueeze(-1)
        return (y.flatten(-2), *args[1:])


class UnitGate(_TransformerGate):
    """One gate per intermediate unit of a block's MLP, on the input of its second linear layer (``l0_units``)."""

    def _gate_units(self, module, args):
        gate = self.gate
        if gate.observer is not None:
            gate.observer(args[0], -1, module)
        return (args[0] * gate().to(args[0].dtype), *args[1:])


class LayerGate(_TransformerGate):
    r"""One scalar gate on a residual branch, :math:`x + z f(x)` (``l0_attention``, ``l0_mlp`` of a block).

    The final phase of the constrained objective may close it (a block's branch may go entirely), but it keeps
    the best-scored branch of each kind (``keep_one_of``: ``"attention"``, ``"mlp"``, ``"cross_attention"``)
    open unless :func:`sparsify_transformer` was given ``may_remove_all=True`` (then ``keep_one_of`` is
    ``None``): a model without any attention (or MLP) is a choice, not what a missed target leaves.
    """

    may_close_all = True

    def __init__(self, num_gates, group_size, keep_one_of=None, **gate_kwargs):
        super().__init__(num_gates, group_size, **gate_kwargs)
        self.keep_one_of = keep_one_of

    def _gate_output(self, module, args, output):
        gate = self.gate
        if gate.observer is not None:
            gate.observer(output[0] if isinstance(output, tuple) else output, None, None)
        if isinstance(output, tuple):
            return (output[0] * gate().to(output[0].dtype), *output[1:])
        return output * gate().to(output.dtype)


class BlockGate(LayerGate):
    r"""One scalar gate on a whole block (``l0_block``; Sheared-LLaMA's layer mask), :math:`z_b`.

    It multiplies the output of every residual branch of its block, together with the branch's own gate:
    :math:`x + z_b z_a\, \mathrm{attn}(x)`, then :math:`x + z_b z_m\, \mathrm{mlp}(x)`. Its value is drawn once per
    call of the block (a forward pre-hook on the block) and read by every branch. A closed block gate closes the
    whole block, which :func:`~l0bayes.pruning.prune` then removes from the model (its normalisation layers with
    it); an open fractional value is folded into the branches' last layers, as a branch gate's is. Attached by
    :func:`sparsify_transformer` with ``depth=True``, to blocks that are the identity when their branches are
    closed (pre-norm blocks such as Llama's and GPT-2's).
    """

    def __init__(self, group_size, keep_one_of=None, **gate_kwargs):
        super().__init__(1, group_size, keep_one_of=keep_one_of, **gate_kwargs)
        self._z = None

    def value(self):
        """The gate of the block's current call (drawn by the pre-hook), or a new draw outside a call of the block."""
        return self._z if self._z is not None else self.gate()

    def _draw(self, module, args):
        self._z = self.gate()

    def _release(self, module, args, output):
        self._z = None

    def _gate_output(self, module, args, output):
        if self.gate.observer is not None:
            self.gate.observer(output[0] if isinstance(output, tuple) else output, None, None)
        z = self.value()
        if isinstance(output, tuple):
            return (output[0] * z.to(output[0].dtype), *output[1:])
        return output * z.to(output.dtype)
