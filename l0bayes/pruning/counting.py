r"""The size and cost of a network, gated, sparsified or pruned: parameters and FLOPs (Table 1 and Fig. 3).

:func:`flops` counts a forward pass exactly; :func:`expected_flops` counts it under the gates'
:math:`q(z \ne 0)` (Eq. 12), the training-time cost of Fig. 3, following the units that
:func:`~l0bayes.pruning.prune` can remove.
"""

import math

import torch
from torch import nn

from ..nn.gates import HardConcreteGate
from ..nn.layers import L0Conv2d, L0Linear
from .dependency import structure
from .sequential import CONV, WEIGHT, in_units, leaves, out_units, segments
from .sparsify import _probe_forward, is_sparsified

__all__ = ["count_parameters", "expected_flops", "flops"]


def count_parameters(module, include_gates=False):
    """Number of scalar parameters; the gates' ``log_alpha`` only with ``include_gates=True``.

    Buffers (e.g. the index of :class:`~l0bayes.pruning.SelectFeatures`) are not parameters and are not counted.
    """
    gate_params = set()
    if not include_gates:
        for m in module.modules():
            if isinstance(m, HardConcreteGate):
                gate_params.update(id(p) for p in m.parameters())
    return sum(p.numel() for p in module.parameters() if id(p) not in gate_params)


def _layer_flops(layer, n_in, n_out, positions):
    """``2 * multiply-adds + bias adds`` of one layer with ``n_in`` / ``n_out`` active units."""
    taps = math.prod(layer.kernel_size) if isinstance(layer, CONV) else 1
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
        if isinstance(m, WEIGHT)
    ]
    p = next(module.parameters(), None)
    x = torch.zeros((1, *shape), dtype=p.dtype if p is not None else None, device=p.device if p is not None else None)
    _probe_forward(module, (x,), hooks)
    return calls


def _positions(layer, out_shape):
    """Output positions per example: ``H * W`` for a conv, the leading dims for a linear layer (1 for 2-d input)."""
    return math.prod(out_shape[-2:]) if isinstance(layer, CONV) else math.prod(out_shape[:-1])


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
        n_in = in_units(layer) // (layer.groups if isinstance(layer, nn.Conv2d) else 1)
        total += _layer_flops(layer, n_in, out_units(layer), _positions(layer, out_shape))
    return int(total)


def expected_flops(module, input_shape):
    r"""Expected FLOPs of one forward pass under the gates' :math:`q(z \ne 0)` (Eq. 12), as in Fig. 3.

    Same counting as :func:`flops`, with the numbers of active input and output units of each
    weight layer replaced by their expectations, assuming independent gates:
    ``2 * E[active in] * kh * kw * E[active out] * H_out * W_out + E[active out] * H_out * W_out``
    (``kh = kw = H_out = W_out = 1`` for a linear layer). The probabilities follow the rules of
    :func:`~l0bayes.pruning.prune`: an input unit is active with probability q(its own input gate) * q(the gate of
    the conv map it comes from); an output unit with probability q(its map's gate) *
    P(at least one of the inputs it feeds is open); network inputs and outputs, and ungated
    units, count with probability 1. With gates that are almost surely 0 or 1 this equals
    ``flops(prune(module), input_shape)``. Returns a differentiable 0-d tensor (it can be penalised).

    For a model of :func:`~l0bayes.pruning.sparsify` the same counting follows the units that
    :func:`prune` can remove (:func:`l0bayes.pruning.dependency.structure`): a removable output channel
    is active with its gate's :math:`q(z \ne 0)` in its layer and in every layer that reads it, a
    gated input neuron of a linear layer with its own :math:`q`; all other units count with probability 1.
    """
    if is_sparsified(module):
        return _expected_flops_graph(module, input_shape)
    out_shapes = {}
    for layer, out_shape in _trace(module, input_shape):
        if id(layer) in out_shapes:
            raise NotImplementedError("expected_flops: a layer called more than once is not supported")
        out_shapes[id(layer)] = out_shape
    layers = leaves(module)
    e_in, e_out = {}, {}
    for seg in segments(layers):
        prod = layers[seg.producer][1] if seg.producer is not None else None
        cons = layers[seg.consumer][1] if seg.consumer is not None else None
        p_open = prod.prob_nonzero() if isinstance(prod, L0Conv2d) and seg.zero_preserving else None
        p_need = cons.prob_nonzero() if isinstance(cons, L0Linear) else None
        if prod is not None:
            n = out_units(prod)
            p = torch.ones(n, dtype=prod.weight.dtype, device=prod.weight.device)
            if cons is not None:
                if p_open is not None:
                    p = p * p_open
                if p_need is not None:
                    p = p * (1.0 - torch.prod(1.0 - p_need.view(n, seg.hw), dim=1))
            e_out[seg.producer] = p.sum()
        if cons is not None:
            p = torch.ones(in_units(cons), dtype=cons.weight.dtype, device=cons.weight.device)
            if p_need is not None:
                p = p * p_need
            if p_open is not None:
                p = p * p_open.repeat_interleave(seg.hw)
            e_in[seg.consumer] = p.sum()
    p = next(module.parameters())
    total = torch.zeros((), dtype=p.dtype, device=p.device)
    for i, (_, layer) in enumerate(layers):
        if isinstance(layer, WEIGHT):
            total = total + _layer_flops(layer, e_in[i], e_out[i], _positions(layer, out_shapes[id(layer)]))
    return total


def _expected_flops_graph(module, input_shape):
    calls = _trace(module, input_shape)
    names = {id(m): n for n, m in module.named_modules()}
    p = next(module.parameters())
    x = torch.zeros((1, *((int(input_shape),) if isinstance(input_shape, int) else input_shape)), dtype=p.dtype)
    factors = {}  # (layer name, "in" / "out") -> tensor of activity probabilities

    def scale(name, side, idxs, q):
        layer = module.get_submodule(name)
        n = in_units(layer) if side == "in" else out_units(layer)
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
            if not isinstance(target, WEIGHT) or name is None:
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
        e_in = factors[(name, "in")].sum() if (name, "in") in factors else in_units(layer)
        e_out = factors[(name, "out")].sum() if (name, "out") in factors else out_units(layer)
        total = total + _layer_flops(layer, e_in / groups, e_out, _positions(layer, out_shape))
    return total
