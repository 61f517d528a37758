r"""Export of a gated network to a smaller dense one, and the size / FLOP counts of Table 1 and Fig. 3.

At test time the paper uses the deterministic gate of Eq. 13,
:math:`\hat z = \min(1, \max(0, \sigma(\log\alpha)(\zeta - \gamma) + \gamma))`, and
:math:`\theta^* = \tilde\theta^* \odot \hat z`. :func:`prune` applies exactly that: groups with
:math:`\hat z = 0` are physically removed and the remaining (possibly fractional) :math:`\hat z`
are folded into the weights, so the dense model reproduces the gated model in ``eval()`` mode.

The walk is generic over an :class:`torch.nn.Sequential` (nested ones are flattened) of
:class:`~l0bayes.nn.layers.L0Linear`, :class:`~l0bayes.nn.layers.L0Conv2d`, ``nn.Linear``,
``nn.Conv2d`` (``groups=1``), ``nn.Flatten`` and channel-wise layers (activations, pooling,
dropout). The network is cut into *segments*: the tensor flowing from one weight layer (the
producer, or the network input) through channel-wise layers and at most a flatten into the next
weight layer (the consumer, or the network output). In a segment a unit (a feature map or a
feature) is dropped when

* it is exactly zero: an output map of an :class:`L0Conv2d` with :math:`\hat z_c = 0` (when every
  layer of the segment maps 0 to 0, as ReLU and max pooling do), or
* it is not used: an input neuron of an :class:`L0Linear` with :math:`\hat z_i = 0`; a producer
  unit is dropped when all the consumer inputs it feeds are closed (a conv map occupies the
  block of ``h * w`` columns ``c*h*w ... (c+1)*h*w - 1`` after flattening).

Network inputs and outputs are never dropped: where the first L0Linear closes some input
features, or where a conv map stays but some of its flattened columns are closed, a
parameter-free :class:`SelectFeatures` (an ``index_select`` on dim 1) is inserted before the
consumer. A tensor always keeps at least one unit (zero-width convolutions do not run); such a
unit has zero weights when its group is closed.
"""

import copy
import math
import warnings
from collections import OrderedDict
from dataclasses import dataclass, field

import torch
from torch import nn

from ..threads import under_thread_policy
from .gates import HardConcreteGate
from .layers import L0Conv2d, L0Linear
from .penalty import l0_layers
from .sparsify import GatedLayer, GroupGate, _probe_forward

_LINEAR = (L0Linear, nn.Linear)
_CONV = (L0Conv2d, nn.Conv2d)
_WEIGHT = _LINEAR + _CONV
# Channel-wise layers with f(0) = 0 on a whole map: a zero map stays a zero map.
_ZERO_PRESERVING = (
    nn.ReLU,
    nn.ReLU6,
    nn.LeakyReLU,
    nn.ELU,
    nn.GELU,
    nn.SiLU,
    nn.Tanh,
    nn.Hardtanh,
    nn.Identity,
    nn.Dropout,
    nn.Dropout2d,
    nn.MaxPool2d,
    nn.AvgPool2d,
    nn.AdaptiveAvgPool2d,
    nn.AdaptiveMaxPool2d,
)
# Channel-wise but f(0) != 0: units pass through unchanged in number, zeros are not zeros after.
_CHANNELWISE = (nn.Sigmoid, nn.Softplus)


class SelectFeatures(nn.Module):
    """Parameter-free selection of the kept units along dimension ``dim``: ``x.index_select(dim, index)``.

    ``index`` is a buffer (moves with ``.to()``, no parameters, no FLOPs counted).
    """

    def __init__(self, index, num_inputs, dim=1):
        super().__init__()
        self.register_buffer("index", torch.as_tensor(index, dtype=torch.long))
        self.num_inputs = int(num_inputs)
        self.dim = int(dim)

    def extra_repr(self):
        return f"{self.index.numel()} of {self.num_inputs}" + (f", dim={self.dim}" if self.dim != 1 else "")

    def forward(self, x):
        return x.index_select(self.dim, self.index)


# ---------------------------------------------------------------------------- the walk


def _leaves(module, prefix=""):
    """``(name, layer)`` for the leaves of (nested) ``nn.Sequential`` s; names joined with ``_``."""
    if isinstance(module, nn.Sequential):
        out = []
        for name, child in module.named_children():
            out.extend(_leaves(child, f"{prefix}{name}_"))
        return out
    name = prefix[:-1] if prefix else "layer"
    if isinstance(module, nn.Conv2d) and module.groups != 1:
        raise NotImplementedError(f"{name}: grouped convolutions are not supported")
    if isinstance(module, nn.Flatten) and (module.start_dim != 1 or module.end_dim != -1):
        raise NotImplementedError(f"{name}: only nn.Flatten(start_dim=1, end_dim=-1) is supported")
    if not isinstance(module, _WEIGHT + _ZERO_PRESERVING + _CHANNELWISE + (nn.Flatten,)):
        raise TypeError(
            f"{name}: {type(module).__name__} is not supported; the walk handles an nn.Sequential of "
            "L0Linear, L0Conv2d, nn.Linear, nn.Conv2d, nn.Flatten and channel-wise activations / pooling / dropout"
        )
    return [(name, module)]


def _in_units(layer):
    return layer.in_features if isinstance(layer, _LINEAR) else layer.in_channels


def _out_units(layer):
    return layer.out_features if isinstance(layer, _LINEAR) else layer.out_channels


@dataclass
class _Segment:
    producer: int | None  # index of the producing weight layer in the leaves; None: network input
    consumer: int | None  # index of the consuming weight layer; None: network output
    ops: list = field(default_factory=list)
    hw: int = 1  # consumer units per producer unit (h * w of a flattened map)
    zero_preserving: bool = True


def _segments(leaves):
    segments, current = [], _Segment(None, None)
    for i, (_, leaf) in enumerate(leaves):
        if isinstance(leaf, _WEIGHT):
            current.consumer = i
            segments.append(current)
            current = _Segment(i, None)
        else:
            current.ops.append(leaf)
    segments.append(current)
    for seg in segments:
        seg.zero_preserving = all(isinstance(op, _ZERO_PRESERVING + (nn.Flatten,)) for op in seg.ops)
        flattens = any(isinstance(op, nn.Flatten) for op in seg.ops)
        if seg.consumer is not None and flattens and isinstance(leaves[seg.consumer][1], _CONV):
            raise NotImplementedError(f"{leaves[seg.consumer][0]}: a convolution after nn.Flatten is not supported")
        if seg.producer is None or seg.consumer is None:
            continue
        (pname, prod), (cname, cons) = leaves[seg.producer], leaves[seg.consumer]
        n_prod, n_cons = _out_units(prod), _in_units(cons)
        from_map = isinstance(prod, _CONV) and isinstance(cons, _LINEAR)
        if from_map and not flattens:
            raise ValueError(f"{pname} -> {cname}: a linear layer after a convolution needs an nn.Flatten")
        if n_cons % n_prod or (n_cons != n_prod and not from_map):
            raise ValueError(f"{pname} -> {cname}: {n_prod} output units do not match {n_cons} input units")
        seg.hw = n_cons // n_prod
    return segments


def _ones(n, like, dtype=torch.bool):
    return torch.ones(n, dtype=dtype, device=like.device)


def _at_least_one(mask, within=None):
    """``mask``, or a mask with only the first unit of ``within`` (default: unit 0) when ``mask`` is empty."""
    if mask.any():
        return mask
    out = torch.zeros_like(mask)
    out[int(within.nonzero()[0]) if within is not None and within.any() else 0] = True
    return out


# ---------------------------------------------------------------------------- prune


def architecture(module):
    """Number of open gates (Eq. 13 gate > 0) per L0 layer, in registration order, joined by ``-``.

    E.g. ``'219-214-100'`` for :class:`~l0bayes.nn.networks.L0MLP` (input neurons of fc1-fc3) and
    ``'20-25-45-462'`` for :class:`~l0bayes.nn.networks.L0LeNet5` (output maps of conv1, conv2,
    then input neurons of fc1, fc2), the format of Table 1.
    """
    with torch.no_grad():
        return "-".join(str(int(layer.active_mask().sum())) for _, layer in l0_layers(module))


@torch.no_grad()
def _dense_copy(layer, keep_in, keep_out):
    """A plain ``nn.Linear`` / ``nn.Conv2d`` with the Eq. 13 gates folded in and the rows / columns kept."""
    weight, bias = layer.weight, layer.bias
    if isinstance(layer, L0Linear):
        weight = weight * layer.gate_values()  # gate i scales column i (Eq. 13: theta* = theta~ . z^)
    elif isinstance(layer, L0Conv2d):
        z = layer.gate_values()  # gate c scales the whole map c, bias included
        weight = weight * z[:, None, None, None]
        bias = bias * z if bias is not None else None
    weight = weight[keep_out][:, keep_in]
    factory = {"device": weight.device, "dtype": weight.dtype, "bias": bias is not None}
    with warnings.catch_warnings():  # zero-width linear layers: "Initializing zero-element tensors"
        warnings.simplefilter("ignore", UserWarning)
        if isinstance(layer, _LINEAR):
            new = nn.utils.skip_init(nn.Linear, weight.shape[1], weight.shape[0], **factory)
        else:
            new = nn.utils.skip_init(
                nn.Conv2d,
                weight.shape[1],
                weight.shape[0],
                layer.kernel_size,
                stride=layer.stride,
                padding=layer.padding,
                dilation=layer.dilation,
                padding_mode=getattr(layer, "padding_mode", "zeros"),
                **factory,
            )
    new.weight.copy_(weight)
    if bias is not None:
        new.bias.copy_(bias[keep_out])
    return new


def _is_sparsified(module):
    return any(isinstance(m, (GatedLayer, GroupGate)) for m in module.modules())


def _example_inputs(module, example_inputs):
    if example_inputs is None:
        example_inputs = getattr(module, "_l0_example_inputs", None)
    if example_inputs is None:
        raise ValueError("pruning a model of sparsify() needs example_inputs (a tensor the model accepts)")
    return example_inputs if isinstance(example_inputs, tuple) else (example_inputs,)


@under_thread_policy
@torch.no_grad()
def prune(module, example_inputs=None):
    r"""A plain dense module equal to ``module`` in ``eval()`` mode, with closed groups removed.

    A model of :func:`~l0bayes.nn.sparsify` (any architecture, residual connections and batch norm
    included) is pruned through its dependency graph: see :mod:`l0bayes.nn.dependency` for what is
    removed. The result is the model's own class with smaller layers (and a
    :class:`SelectFeatures` in front of a linear layer whose closed inputs stay in use elsewhere),
    without gates or hooks; it exports with :func:`torch.export.export`. ``example_inputs`` (a tensor
    or tuple of tensors the model accepts) defaults to the one given to :func:`~l0bayes.nn.sparsify`.

    Otherwise ``module`` is an ``nn.Sequential`` of L0 layers (:class:`~l0bayes.nn.L0MLP`,
    :class:`~l0bayes.nn.L0LeNet5`, ...) and the result a plain ``nn.Sequential``:

    Input neurons and feature maps whose Eq. 13 gate is 0 are physically removed (smaller
    weight tensors), as are the producer units that only feed closed inputs (an output neuron of
    fc\ :sub:`k` closed by fc\ :sub:`k+1`'s input gate; a conv map whose flattened columns are all
    closed), the input channels of a convolution fed by closed maps, and the flattened columns
    of closed maps. The remaining Eq. 13 gate values, fractional ones included, are folded into
    the weights (``W[:, i] * z_i`` for :class:`L0Linear`, ``(W_c, b_c) * z_c`` for
    :class:`L0Conv2d`). Contains only ``nn.Linear``, ``nn.Conv2d``, copies of the other layers and
    :class:`SelectFeatures`; returned in ``eval()`` mode. See the module docstring for the rules.

    Runs under :func:`~l0bayes.threads.thread_policy` (one intra-op thread unless you chose otherwise).
    """
    if _is_sparsified(module):
        from .dependency import prune_graph

        return prune_graph(module, _example_inputs(module, example_inputs))
    leaves = _leaves(module)
    keep_in, keep_out, selects = {}, {}, {}
    for seg in _segments(leaves):
        prod = leaves[seg.producer][1] if seg.producer is not None else None
        cons = leaves[seg.consumer][1] if seg.consumer is not None else None
        if prod is not None:
            keep = _ones(_out_units(prod), prod.weight)
            if cons is not None:  # network outputs are never dropped
                if seg.zero_preserving and isinstance(prod, L0Conv2d):
                    keep &= prod.active_mask()
                if isinstance(cons, L0Linear):
                    keep &= cons.active_mask().view(-1, seg.hw).any(1)
                keep = _at_least_one(keep)
            keep_out[seg.producer] = keep
        if cons is not None:
            n = _in_units(cons)
            available = keep_out[seg.producer].repeat_interleave(seg.hw) if prod is not None else _ones(n, cons.weight)
            need = cons.active_mask() if isinstance(cons, L0Linear) else _ones(n, cons.weight)
            keep = _at_least_one(available & need, within=available)
            keep_in[seg.consumer] = keep
            index = keep[available].nonzero().flatten()
            if index.numel() < int(available.sum()):
                selects[seg.consumer] = SelectFeatures(index, int(available.sum()))
    out = OrderedDict()
    for i, (name, leaf) in enumerate(leaves):
        if i in selects:
            out[f"select_{name}"] = selects[i]
        out[name] = _dense_copy(leaf, keep_in[i], keep_out[i]) if isinstance(leaf, _WEIGHT) else copy.deepcopy(leaf)
    return nn.Sequential(out).eval()


# ---------------------------------------------------------------------------- counting


def count_parameters(module, include_gates=False):
    """Number of scalar parameters; the gates' ``log_alpha`` only with ``include_gates=True``.

    Buffers (e.g. the index of :class:`SelectFeatures`) are not parameters and are not counted.
    """
    gate_params = set()
    if not include_gates:
        for m in module.modules():
            if isinstance(m, HardConcreteGate):
                gate_params.update(id(p) for p in m.parameters())
    return sum(p.numel() for p in module.parameters() if id(p) not in gate_params)


def _layer_flops(layer, n_in, n_out, positions):
    """``2 * multiply-adds + bias adds`` of one layer with ``n_in`` / ``n_out`` active units."""
    taps = math.prod(layer.kernel_size) if isinstance(layer, _CONV) else 1
    flops = 2 * n_in * taps * n_out * positions
    if layer.bias is not None:
        flops = flops + n_out * positions
    return flops


def _trace(module, input_shape):
    """``[(layer, output shape without batch)]`` for every call of a weight layer, from one eval forward."""
    shape = (int(input_shape),) if isinstance(input_shape, int) else tuple(int(s) for s in input_shape)
    calls = []
    hooks = [
        m.register_forward_hook(lambda m, inputs, output: calls.append((m, tuple(output.shape[1:]))))
        for m in module.modules()
        if isinstance(m, _WEIGHT)
    ]
    p = next(module.parameters(), None)
    x = torch.zeros((1, *shape), dtype=p.dtype if p is not None else None, device=p.device if p is not None else None)
    _probe_forward(module, (x,), hooks)
    return calls


def _positions(layer, out_shape):
    """Output positions per example: ``H * W`` for a conv, the leading dims for a linear layer (1 for 2-d input)."""
    return math.prod(out_shape[-2:]) if isinstance(layer, _CONV) else math.prod(out_shape[:-1])


def flops(module, input_shape):
    """Floating point operations of one forward pass of one example of shape ``input_shape`` (no batch dim).

    Counted exactly: for every ``nn.Linear`` / ``L0Linear`` ``2 * in * out + out`` (one multiply and
    one add per multiply-add, plus one add per bias), for every ``nn.Conv2d`` / ``L0Conv2d``
    ``2 * (in_channels / groups) * kh * kw * out_channels * H_out * W_out + out_channels * H_out * W_out``
    (the last term only with a bias). Not counted: activations, pooling, flatten, index selects
    and the gate multiplications of the L0 layers; so an L0 network counts as its dense
    counterpart (all groups present) and a pruned one as its smaller layers. Returns an ``int``.
    """
    total = 0
    for layer, out_shape in _trace(module, input_shape):
        n_in = _in_units(layer) // (layer.groups if isinstance(layer, nn.Conv2d) else 1)
        total += _layer_flops(layer, n_in, _out_units(layer), _positions(layer, out_shape))
    return int(total)


def expected_flops(module, input_shape):
    r"""Expected FLOPs of one forward pass under the gates' :math:`q(z \ne 0)` (Eq. 12), as in Fig. 3.

    Same counting as :func:`flops`, with the numbers of active input and output units of each
    weight layer replaced by their expectations, assuming independent gates:
    ``2 * E[active in] * kh * kw * E[active out] * H_out * W_out + E[active out] * H_out * W_out``
    (``kh = kw = H_out = W_out = 1`` for a linear layer). The probabilities follow the rules of
    :func:`prune`: an input unit is active with probability q(its own input gate) * q(the gate of
    the conv map it comes from); an output unit with probability q(its map's gate) *
    P(at least one of the inputs it feeds is open); network inputs and outputs, and ungated
    units, count with probability 1. With gates that are almost surely 0 or 1 this equals
    ``flops(prune(module), input_shape)``. Returns a differentiable 0-d tensor (it can be penalised).

    For a model of :func:`~l0bayes.nn.sparsify` the same counting follows the units that
    :func:`prune` can remove (:func:`l0bayes.nn.dependency.structure`): a removable output channel
    is active with its gate's :math:`q(z \ne 0)` in its layer and in every layer that reads it, a
    gated input neuron of a linear layer with its own :math:`q`; all other units count with probability 1.
    """
    if _is_sparsified(module):
        return _expected_flops_graph(module, input_shape)
    out_shapes = {}
    for layer, out_shape in _trace(module, input_shape):
        if id(layer) in out_shapes:
            raise NotImplementedError("expected_flops: a layer called more than once is not supported")
        out_shapes[id(layer)] = out_shape
    leaves = _leaves(module)
    e_in, e_out = {}, {}
    for seg in _segments(leaves):
        prod = leaves[seg.producer][1] if seg.producer is not None else None
        cons = leaves[seg.consumer][1] if seg.consumer is not None else None
        p_open = prod.prob_nonzero() if isinstance(prod, L0Conv2d) and seg.zero_preserving else None
        p_need = cons.prob_nonzero() if isinstance(cons, L0Linear) else None
        if prod is not None:
            n = _out_units(prod)
            p = torch.ones(n, dtype=prod.weight.dtype, device=prod.weight.device)
            if cons is not None:
                if p_open is not None:
                    p = p * p_open
                if p_need is not None:
                    p = p * (1.0 - torch.prod(1.0 - p_need.view(n, seg.hw), dim=1))
            e_out[seg.producer] = p.sum()
        if cons is not None:
            p = torch.ones(_in_units(cons), dtype=cons.weight.dtype, device=cons.weight.device)
            if p_need is not None:
                p = p * p_need
            if p_open is not None:
                p = p * p_open.repeat_interleave(seg.hw)
            e_in[seg.consumer] = p.sum()
    p = next(module.parameters())
    total = torch.zeros((), dtype=p.dtype, device=p.device)
    for i, (_, layer) in enumerate(leaves):
        if isinstance(layer, _WEIGHT):
            total = total + _layer_flops(layer, e_in[i], e_out[i], _positions(layer, out_shapes[id(layer)]))
    return total


def _expected_flops_graph(module, input_shape):
    from .dependency import structure

    calls = _trace(module, input_shape)
    names = {id(m): n for n, m in module.named_modules()}
    p = next(module.parameters())
    x = torch.zeros((1, *((int(input_shape),) if isinstance(input_shape, int) else input_shape)), dtype=p.dtype)
    factors = {}  # (layer name, "in" / "out") -> tensor of activity probabilities

    def scale(name, side, idxs, q):
        layer = module.get_submodule(name)
        n = _in_units(layer) if side == "in" else _out_units(layer)
        current = factors.get((name, side), torch.ones(n, dtype=q.dtype, device=q.device))
        idx = torch.as_tensor(idxs, dtype=torch.long, device=q.device)
        factors[(name, side)] = current * torch.ones_like(current).index_copy(0, idx, q)

    for unit, items in structure(module, (x.to(p.device),)):
        q = unit.layer.prob_nonzero()
        if unit.kind == "in":
            scale(unit.root, "in", list(range(q.numel())), q)
        if items is None:
            continue
        for name, item in items:
            target = item.dep.target.module
            if not isinstance(target, _WEIGHT) or name is None:
                continue
            root = torch.as_tensor(item.root_idxs, dtype=torch.long, device=q.device)
            side = "out" if item.dep.handler.__name__ == "prune_out_channels" else "in"
            if unit.kind == "out" or (side == "out" and len(item.idxs) == q.numel()):
                if not (unit.kind == "in" and name == unit.root):
                    scale(name, side, list(item.idxs), q[root])
    total = torch.zeros((), dtype=p.dtype, device=p.device)
    for layer, out_shape in calls:
        name = names[id(layer)]
        groups = layer.groups if isinstance(layer, nn.Conv2d) else 1
        e_in = factors[(name, "in")].sum() if (name, "in") in factors else _in_units(layer)
        e_out = factors[(name, "out")].sum() if (name, "out") in factors else _out_units(layer)
        total = total + _layer_flops(layer, e_in / groups, e_out, _positions(layer, out_shape))
    return total


# ---------------------------------------------------------------------------- report


@dataclass
class PruneReport:
    """Sizes of a gated network before and after :func:`prune` (Table 1, Fig. 3).

    ``params_*`` from :func:`count_parameters` (gates excluded), ``flops_*`` from :func:`flops`,
    ``expected_flops`` from :func:`expected_flops` (the training-time cost under q(z != 0)).
    """

    architecture: str
    params_dense: int
    params_pruned: int
    flops_dense: int
    flops_pruned: int
    expected_flops: float
    pruned: nn.Module | None = field(default=None, repr=False, compare=False)

    @classmethod
    @under_thread_policy
    def from_model(cls, module, input_shape):
        """Prune ``module`` (kept in :attr:`pruned`) and count both; ``input_shape`` without batch dim.

        Runs under :func:`~l0bayes.threads.thread_policy` (one intra-op thread unless you chose otherwise).
        """
        pruned = prune(module)
        with torch.no_grad():
            expected = float(expected_flops(module, input_shape))
        return cls(
            architecture=architecture(module),
            params_dense=count_parameters(module),
            params_pruned=count_parameters(pruned),
            flops_dense=flops(module, input_shape),
            flops_pruned=flops(pruned, input_shape),
            expected_flops=expected,
            pruned=pruned,
        )

    @property
    def compression(self):
        """``params_dense / params_pruned``."""
        return self.params_dense / max(self.params_pruned, 1)

    @property
    def speedup(self):
        """``flops_dense / flops_pruned``."""
        return self.flops_dense / max(self.flops_pruned, 1)

    def summary(self):
        """A small text table."""
        rows = [
            ("", "dense", "pruned", "ratio"),
            ("parameters", f"{self.params_dense:,}", f"{self.params_pruned:,}", f"{self.compression:.2f}x"),
            ("FLOPs", f"{self.flops_dense:,}", f"{self.flops_pruned:,}", f"{self.speedup:.2f}x"),
        ]
        widths = [max(len(r[k]) for r in rows) for k in range(4)]
        lines = [f"architecture (Eq. 13 gates open): {self.architecture}"]
        for row in rows:
            cells = [
                cell.ljust(w) if k == 0 else cell.rjust(w) for k, (cell, w) in enumerate(zip(row, widths, strict=True))
            ]
            lines.append("  ".join(cells))
        lines.append(f"expected FLOPs under q(z != 0) (Fig. 3): {self.expected_flops:,.0f}")
        return "\n".join(lines)
