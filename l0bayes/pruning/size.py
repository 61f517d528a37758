r"""What the pruned model keeps: parameters and FLOPs of a gated network, in expectation and at test time.

A weight of a gated network survives :func:`~l0bayes.pruning.prune` only if both of its units do: its
input unit (a column of a linear layer, an input channel of a convolution) and its output unit (a row,
an output channel), each alive through every layer that couples it: an input neuron closed by its own
gate, an output neuron that feeds only closed inputs of the next layer, a convolution channel closed by
its gate together with its batch norm channel and the next layer's input channel (the rules of
:func:`~l0bayes.pruning.prune`). So the size of the pruned model is a sum over its layers of products

.. math::

    |\theta_{\text{kept}}| = \sum_l \frac{k_l}{g_l}\, n^{\text{in}}_l\, n^{\text{out}}_l
        + b_l\, n^{\text{out}}_l + c_l,

with :math:`n^{\text{in}}_l, n^{\text{out}}_l` the numbers of live input and output units of layer
:math:`l`, :math:`k_l` its kernel taps, :math:`g_l` its convolution groups, :math:`b_l` one when it has a
bias (two per channel for an affine batch norm) and :math:`c_l` the parameters no gate touches. Each
:math:`n` is a sum over units of a product of gates of *different* layers (a unit of layer :math:`l` is
alive when its own gate and the gates that couple it are open), and the gates of :math:`n^{\text{in}}_l`
and :math:`n^{\text{out}}_l` are disjoint sets. Under the independent gates of :math:`q`, the
expectation therefore factorises: :math:`\mathbb E[z_{\text{in}} z_{\text{out}}] = q_{\text{in}}
q_{\text{out}}`, and :math:`\mathbb E|\theta_{\text{kept}}|` is the same formula with every unit's
probability of being alive, :math:`\prod q(z \ne 0)` (Eq. 12) over its gates, in place of its
indicator. The FLOPs per example (:func:`~l0bayes.pruning.flops`) are the same kind of sum.

:class:`NetworkSize` holds that structure for one network (built once: the graph of a sparsified
model is traced with torch-pruning); :func:`expected_density` / :func:`test_time_density` and
:func:`expected_flops_fraction` / :func:`test_time_flops_fraction` are the fractions of the dense
model's parameters and FLOPs ("Constrained sparsity" in ``docs/mathematics.md``).

**What counts.** Every parameter of the network except the gates' ``log_alpha``: weights, biases and
batch norm's weight and bias (its running statistics are buffers). The dense model is the same network
with every gate open, i.e. :func:`~l0bayes.pruning.count_parameters` of it. At test time (Eq. 13 gates)
the kept count equals ``count_parameters(prune(net))`` exactly, including :func:`prune`'s rule that a
tensor keeps at least one unit; the expectation leaves that rule out.
"""

import math
import weakref

import torch
from torch import nn

from ..nn.density import density_names
from ..nn.gates import gate_owners, gate_parameter_ids, gates_of
from ..nn.layers import L0Conv2d, L0Linear
from .counting import count_parameters, output_positions, weight_layer_calls
from .dependency import structure
from .sequential import CONV, PLAIN_CONV, WEIGHT, in_units, leaves, out_units, segments
from .sparsify import GroupGate, is_sparsified
from .transformer import TransformerSize, is_transformer_gated

__all__ = [
    "NetworkSize",
    "expected_density",
    "expected_flops",
    "expected_flops_fraction",
    "network_size",
    "test_time_density",
    "test_time_flops_fraction",
]

_BATCH_NORM = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)


class _Factor:
    """One gate layer's contribution to the probability that each unit of one side of a module is alive.

    ``op``: ``"direct"`` (unit ``i`` is gate ``i``), ``"repeat"`` (``hw`` consecutive units per gate: the
    flattened columns of a map), ``"any"`` (unit ``i`` is alive when any of gates ``i*hw ... (i+1)*hw - 1``
    is: a producer unit feeding a block of inputs), ``"index"`` (units ``idx`` are gates ``root``, the
    others are untouched).
    """

    __slots__ = ("layer", "op", "hw", "idx", "root")

    def __init__(self, layer, op, hw=1, idx=None, root=None):
        self.layer, self.op, self.hw, self.idx, self.root = layer, op, int(hw), idx, root

    def apply(self, vector, values):
        v = values[id(self.layer)]
        if self.op == "direct":
            return vector * v
        if self.op == "repeat":
            return vector * v.repeat_interleave(self.hw)
        if self.op == "any":
            return vector * (1.0 - _row_products(1.0 - v.view(-1, self.hw)))
        if self.idx.device != v.device:  # moved once, not on every step
            self.idx, self.root = self.idx.to(v.device), self.root.to(v.device)
        return vector * torch.ones_like(vector).index_copy(0, self.idx, v[self.root])


def _row_products(matrix):
    """The product of each row of a 2-d tensor, as ``torch.prod(matrix, dim=1)``, by pairwise multiplication.

    ``torch.prod``'s backward asks the device whether the input holds a zero (a read back to the host), which a
    step captured as a CUDA graph may not do (:mod:`l0bayes.inference.graphed`); products of halves, about
    ``log2`` of the row length of them, differentiate without that, zeros included.
    """
    while matrix.shape[1] > 1:
        if matrix.shape[1] % 2:
            matrix = torch.cat([matrix, torch.ones_like(matrix[:, :1])], dim=1)
        matrix = matrix[:, 0::2] * matrix[:, 1::2]
    return matrix[:, 0]


class _Side:
    """The units of one side (``"in"`` / ``"out"``) of one module, and the factors that keep them alive."""

    __slots__ = ("n", "factors")

    def __init__(self, n):
        self.n = int(n)
        self.factors = []

    def alive(self, values, like):
        """Expected (or, with 0/1 gate values, exact) number of alive units: a 0-d tensor."""
        if not self.factors:
            return like.new_full((), float(self.n))  # a fill kernel: no host copy (CUDA graphs)
        vector = torch.ones(self.n, dtype=like.dtype, device=like.device)
        for f in self.factors:
            vector = f.apply(vector, values)
        return vector.sum()


class NetworkSize:
    r"""The parameters and FLOPs that :func:`~l0bayes.pruning.prune` keeps of a gated network, given its gates.

    :param module: the gated network (an ``nn.Sequential`` of L0 layers such as :class:`~l0bayes.nn.L0MLP`,
        or a model of :func:`~l0bayes.pruning.sparsify`), or a model holding it as ``net``.
    :param input_shape: one example's shape (no batch dimension); needed for FLOPs only. A model of
        :func:`~l0bayes.pruning.sparsify` defaults to its example inputs.

    Built once (the structure does not depend on the gate values); :meth:`parameters` and :meth:`flops`
    then cost a few small tensor operations, cheap enough for every training step. Per gated layer
    (``per_layer=True``), the entries are keyed by :func:`~l0bayes.nn.density.density_names` and count
    the layer's own parameters (or FLOPs): for a :class:`~l0bayes.pruning.Group`, those of its modules.
    """

    def __init__(self, module, input_shape=None):
        net = _network(module)
        self.net = net
        self.graph = is_sparsified(net)
        self.sides = {}  # id(module) -> {"in": _Side, "out": _Side}
        self.modules = {}  # id(module) -> module (those with parameters, gates excluded)
        owners = gate_owners(net)
        self.gated = [layer for layer, _ in owners]
        self.gates = [gate for _, gate in owners]
        self._gate_params = gate_parameter_ids(net)
        for m in net.modules():
            if self._own_parameters(m):
                self.modules[id(m)] = m
        self._dense_cache = {}  # (what, modules) -> the dense count of those modules
        self.names = density_names(module) if self.gates else []
        self._layer_modules = [self._own_modules(layer) for layer in self.gated]
        #: ``True`` when the counts follow prune(); ``False`` for a network prune() cannot walk (e.g. a
        #: regression's gated coefficients, a custom module that is neither a Sequential of L0 layers nor
        #: sparsified): each gate then counts alone, over the gated parameters (the gate-level density).
        self.cascade = True
        self.input_shape = None
        self.calls = None
        if self.graph:
            self._build_graph(net)
        else:
            try:
                self._build_sequential(net)
            except (TypeError, NotImplementedError, ValueError):
                self.cascade = False
                self.sides = {}
        if not self.cascade:
            self._gate_sizes = {id(layer): g.group_size for layer, g in zip(self.gated, self.gates, strict=True)}
            self.dense_parameters = sum(g.group_size * g.num_gates for g in self.gates)
            return
        self.dense_parameters = count_parameters(net)
        if input_shape is None and self.graph and getattr(net, "_l0_example_inputs", None) is not None:
            example = net._l0_example_inputs
            example = example[0] if isinstance(example, tuple) else example
            input_shape = tuple(example.shape[1:])
        if input_shape is not None:
            self.input_shape = (
                (int(input_shape),) if isinstance(input_shape, int) else tuple(int(s) for s in input_shape)
            )
            self.calls = [
                (layer, output_positions(layer, out_shape))
                for layer, out_shape in weight_layer_calls(net, self.input_shape)
            ]
            self.dense_flops = float(self._flops_of(self._values(None), exact=True))

    # ------------------------------------------------------------------ structure
    def _side(self, module, side):
        sides = self.sides.setdefault(id(module), {})
        if side not in sides:
            sides[side] = _Side(in_units(module) if side == "in" else _out_units(module))
        return sides[side]

    def _build_sequential(self, net):
        layers = leaves(net)
        for seg in segments(layers):
            prod = layers[seg.producer][1] if seg.producer is not None else None
            cons = layers[seg.consumer][1] if seg.consumer is not None else None
            opens = isinstance(prod, L0Conv2d) and seg.zero_preserving
            needs = isinstance(cons, L0Linear)
            if prod is not None and cons is not None:  # network outputs are never dropped
                side = self._side(prod, "out")
                if opens:
                    side.factors.append(_Factor(prod, "direct"))
                if needs:
                    side.factors.append(_Factor(cons, "any", hw=seg.hw))
            if cons is not None:
                side = self._side(cons, "in")
                if needs:
                    side.factors.append(_Factor(cons, "direct"))
                if opens:
                    side.factors.append(_Factor(prod, "repeat", hw=seg.hw))

    def _build_graph(self, net):
        example = getattr(net, "_l0_example_inputs", None)
        if example is None:
            raise ValueError(
                "the sizes of a model of sparsify() come from its dependency graph, traced on the example_inputs "
                "given to sparsify: this one was sparsified without them; sparsify it with example_inputs=(a batch "
                "of its inputs)"
            )
        example = example if isinstance(example, tuple) else (example,)
        for unit, items in structure(net, example):
            layer = unit.layer
            n = layer.num_gates
            if unit.kind == "in":
                self._side(net.get_submodule(unit.root), "in").factors.append(_Factor(layer, "direct"))
            if items is None:
                continue
            for name, item in items:
                if name is None:
                    continue
                target = net.get_submodule(name)
                if id(target) not in self.modules or not isinstance(target, WEIGHT + _BATCH_NORM):
                    continue
                out = item.dep.handler.__name__ == "prune_out_channels" or isinstance(target, _BATCH_NORM)
                if unit.kind == "in" and (name == unit.root or not out or len(set(item.idxs)) != n):
                    continue  # a producer is removed with the inputs it feeds only when they map one to one
                idx = torch.as_tensor(list(item.idxs), dtype=torch.long)
                root = torch.as_tensor(list(item.root_idxs), dtype=torch.long)
                self._side(target, "out" if out else "in").factors.append(_Factor(layer, "index", idx=idx, root=root))

    def _own_modules(self, layer):
        if isinstance(layer, GroupGate):
            return [self.net.get_submodule(n) for n in layer.module_names]
        return [layer]

    # ------------------------------------------------------------------ values
    def _values(self, kind):
        """Per gate layer: ``q(z != 0)`` (``"expected"``), the Eq. 13 open mask (``"test"``), or all open (``None``)."""
        values = {}
        for layer, gate in zip(self.gated, self.gates, strict=True):
            if kind == "expected":
                values[id(layer)] = gate.prob_nonzero()
            elif kind == "test":  # float64: counts exact up to 2**53
                values[id(layer)] = gate.active().to(torch.float64)
            else:
                values[id(layer)] = torch.ones_like(gate.log_alpha.detach(), dtype=torch.float64)
        return values

    def _alive(self, module, side, values, like, exact):
        sides = self.sides.get(id(module), {})
        if side not in sides:
            n = in_units(module) if side == "in" else _out_units(module)
            return like.new_full((), float(n))
        count = sides[side].alive(values, like)
        return count.clamp(min=1.0) if exact else count  # prune() keeps at least one unit

    def _own_parameters(self, module):
        """``module``'s own parameters, its gates' ``log_alpha`` excluded."""
        return [p for p in module.parameters(recurse=False) if id(p) not in self._gate_params]

    def _module_parameters(self, module, values, like, exact):
        own = self._own_parameters(module)
        if id(module) not in self.sides:
            return like.new_full((), float(sum(p.numel() for p in own)))
        n_out, n_in = _out_units(module), (in_units(module) if isinstance(module, WEIGHT) else 1)
        alive_out = self._alive(module, "out", values, like, exact)
        alive_in = self._alive(module, "in", values, like, exact) if isinstance(module, WEIGHT) else None
        total = like.new_zeros(())
        for p in own:
            if p.dim() >= 2:  # (out, in / groups, ...): one weight per live (out, in) pair
                total = total + (p.numel() / (n_out * n_in)) * alive_out * alive_in
            else:  # a bias, or a batch norm's weight / bias: one per live output unit
                total = total + (p.numel() / n_out) * alive_out
        return total

    def _like(self, values):
        v = next(iter(values.values()), None)
        if v is None:  # a network without gates: its dense counts
            p = next(self.net.parameters())
            return torch.zeros((), dtype=p.dtype, device=p.device)
        return v.new_zeros(())

    def _parameters_of(self, values, exact, modules=None):
        like = self._like(values)
        if not self.cascade:
            layers = self.gated if modules is None else [m for m in self.gated if any(m is o for o in modules)]
            return sum((self._gate_sizes[id(m)] * values[id(m)].sum() for m in layers), like.new_zeros(()))
        total = like.new_zeros(())
        for m in modules if modules is not None else self.modules.values():
            total = total + self._module_parameters(m, values, like, exact)
        return total

    def _flops_of(self, values, exact, modules=None):
        like = self._like(values)
        keep = None if modules is None else {id(m) for m in modules}
        total = like.new_zeros(())
        for layer, positions in self.calls:
            if keep is not None and id(layer) not in keep:
                continue
            groups = layer.groups if isinstance(layer, PLAIN_CONV) else 1
            n_in = self._alive(layer, "in", values, like, exact)
            n_out = self._alive(layer, "out", values, like, exact)
            taps = math.prod(layer.kernel_size) if isinstance(layer, CONV) else 1
            total = total + 2 * (n_in / groups) * taps * n_out * positions
            if layer.bias is not None:
                total = total + n_out * positions
        return total

    def _dense_of(self, what, modules):
        key = (what, tuple(id(m) for m in modules))
        if key not in self._dense_cache:
            self._dense_cache[key] = self._dense_uncached(what, modules)
        return self._dense_cache[key]

    def _dense_uncached(self, what, modules):
        ones = self._values(None)
        if what == "parameters":
            return float(self._parameters_of(ones, exact=True, modules=modules))
        return float(self._flops_of(ones, exact=True, modules=modules))

    def _need_flops(self):
        if not self.cascade:
            raise ValueError(
                "FLOPs of the pruned model need a network that prune() handles (an nn.Sequential of L0 layers, "
                "or a model of sparsify())"
            )
        if self.calls is None:
            raise ValueError("FLOPs need the shape of one example: NetworkSize(module, input_shape=...)")

    # ------------------------------------------------------------------ public
    def parameters(self, kind="expected", per_layer=False):
        r"""Parameters the pruned model keeps: ``kind="expected"`` under :math:`q` (a differentiable 0-d tensor, or
        shape ``(L,)`` per layer), ``"test"`` with the Eq. 13 gates (a float, or ``{layer: float}``)."""
        return self._measure("parameters", kind, per_layer, fraction=False)

    def flops(self, kind="expected", per_layer=False):
        """FLOPs per example of the pruned model (counted as :func:`~l0bayes.pruning.flops`), as :meth:`parameters`."""
        self._need_flops()
        return self._measure("flops", kind, per_layer, fraction=False)

    def fraction(self, what="parameters", kind="expected", per_layer=False):
        """:meth:`parameters` or :meth:`flops` over the dense model's (``per_layer``: over each layer's own)."""
        if what not in ("parameters", "flops"):
            raise ValueError(f"what must be 'parameters' or 'flops', got {what!r}")
        if what == "flops":
            self._need_flops()
        return self._measure(what, kind, per_layer, fraction=True)

    def fraction_at(self, values, what="parameters", per_layer=False):
        """The pruned model's fractions (a list: one entry, or one per layer) for given 0/1 gate values.

        ``values`` maps ``id(gated layer)`` to a float64 tensor of 0s and 1s per gate (open or closed), as
        the final phase of the constrained objective tries sets of groups.
        """
        out = self._measure(what, "test", per_layer, fraction=True, values=values)
        return list(out.values()) if per_layer else [out]

    def _measure(self, what, kind, per_layer, fraction, values=None):
        if kind not in ("expected", "test"):
            raise ValueError(f"kind must be 'expected' or 'test', got {kind!r}")
        exact = kind == "test"
        values = self._values(kind) if values is None else values
        count = self._parameters_of if what == "parameters" else self._flops_of
        if not per_layer:
            value = count(values, exact)
            if fraction:
                value = value / (self.dense_parameters if what == "parameters" else self.dense_flops)
            return float(value) if exact else value
        out = []
        for modules in self._layer_modules:
            value = count(values, exact, modules)
            if fraction:
                value = value / self._dense_of(what, modules)
            out.append(value)
        if exact:
            return {name: float(v) for name, v in zip(self.names, out, strict=True)}
        return torch.stack(out)


def _out_units(module):
    if isinstance(module, WEIGHT):
        return out_units(module)
    if isinstance(module, _BATCH_NORM):
        return module.num_features
    return 1


def _network(module):
    net = getattr(module, "net", None)
    if isinstance(net, nn.Module) and gates_of(net) and len(gates_of(net)) == len(gates_of(module)):
        return net
    return module


_CACHE = weakref.WeakKeyDictionary()


def network_size(module, input_shape=None):
    """The :class:`NetworkSize` of ``module``, built once per network and input shape (cached).

    For a model of :func:`~l0bayes.pruning.sparsify_transformer`, a
    :class:`~l0bayes.pruning.transformer.TransformerSize` (the same interface; FLOPs per token).
    """
    net = _network(module)
    if not gates_of(net) and input_shape is None:
        raise ValueError("the module has no HardConcreteGate")
    shape = None if input_shape is None else tuple(input_shape) if not isinstance(input_shape, int) else (input_shape,)
    per_net = _CACHE.setdefault(net, {})
    if shape not in per_net:
        per_net[shape] = TransformerSize(module, shape) if is_transformer_gated(net) else NetworkSize(module, shape)
    size = per_net[shape]
    if size.gates:
        size.names = density_names(module)  # the caller's naming (with or without the model's ``net.``)
    return size


def expected_density(module, per_layer=False):
    r"""Expected fraction of the dense model's parameters that the pruned model keeps, under :math:`q`.

    :math:`\mathbb E_q|\theta_{\text{kept}}| / |\theta|` (module docstring), differentiable in every
    ``log_alpha``: what the constrained objective's Lagrangian differentiates. Shape ``(1,)``, or with
    ``per_layer`` one entry per gated layer (over that layer's own parameters).
    """
    value = network_size(module).fraction("parameters", "expected", per_layer)
    return value if per_layer else value.reshape(1)


@torch.no_grad()
def test_time_density(module, per_layer=False):
    """Fraction of the dense model's parameters that :func:`~l0bayes.pruning.prune` keeps with the Eq. 13 gates.

    Equal to ``count_parameters(prune(net)) / count_parameters(net)``; a float, or with ``per_layer``
    ``{layer name: fraction of that layer's own parameters}`` (names from :func:`~l0bayes.nn.density.density_names`).
    """
    return network_size(module).fraction("parameters", "test", per_layer)


def expected_flops(module, input_shape):
    r"""Expected FLOPs per example of the pruned model under the gates' :math:`q(z \ne 0)` (Eq. 12), as in Fig. 3.

    Counted as :func:`~l0bayes.pruning.flops` counts the pruned model, with every unit's indicator of being
    alive replaced by its probability under :math:`q` (module docstring): a differentiable 0-d tensor
    (it can be penalised). With gates that are almost surely 0 or 1 it equals ``flops(prune(net), input_shape)``.
    """
    return network_size(module, input_shape).flops("expected")


def expected_flops_fraction(module, input_shape=None, per_layer=False):
    """Expected fraction of the dense model's FLOPs per example that the pruned model keeps, under :math:`q`."""
    return network_size(module, input_shape).fraction("flops", "expected", per_layer)


@torch.no_grad()
def test_time_flops_fraction(module, input_shape=None, per_layer=False):
    """``flops(prune(net)) / flops(net)`` per example of shape ``input_shape``, from the Eq. 13 gates."""
    return network_size(module, input_shape).fraction("flops", "test", per_layer)
