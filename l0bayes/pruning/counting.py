r"""The size and cost of a network as it is: parameters and FLOPs of one forward pass (Table 1).

:func:`count_parameters` and :func:`flops` count a module exactly as it stands (a gated network as its
dense counterpart, a pruned one as its smaller layers). What a gated network *keeps* once pruned, in
expectation under :math:`q` or with the Eq. 13 gates, is :mod:`l0bayes.pruning.size`.
"""

import math

import torch

from ..nn.gates import gate_parameter_ids
from .hooks import probe_forward
from .sequential import CONV, PLAIN_CONV, WEIGHT, in_units, out_units

__all__ = ["count_parameters", "flops", "layer_flops", "output_positions", "weight_layer_calls"]


def count_parameters(module, include_gates=False):
    """Number of scalar parameters; the gates' ``log_alpha`` only with ``include_gates=True``.

    Buffers (e.g. the index of :class:`~l0bayes.pruning.SelectFeatures`) are not parameters and are not counted.
    """
    gate_params = set() if include_gates else gate_parameter_ids(module)
    return sum(p.numel() for p in module.parameters() if id(p) not in gate_params)


def layer_flops(layer, n_in, n_out, positions):
    """``2 * multiply-adds + bias adds`` of one call of a weight layer with ``n_in`` / ``n_out`` active units.

    :param layer: an ``nn.Linear`` or convolution (plain or L0); its kernel's taps and its bias count.
    :param n_in: the input units one output unit reads (a grouped convolution's ``in_channels / groups``).
    :param positions: the output positions per example (:func:`output_positions`).
    """
    taps = math.prod(layer.kernel_size) if isinstance(layer, CONV) else 1
    flops = 2 * n_in * taps * n_out * positions
    if layer.bias is not None:
        flops = flops + n_out * positions
    return flops


def weight_layer_calls(module, input_shape):
    """``[(layer, output shape without batch)]`` for every call of a weight layer of ``module``, in call order.

    From one ``eval()``, no-grad forward of a zero example of shape ``input_shape`` (no batch dimension), with
    the dtype and on the device of ``module``'s parameters.
    """
    shape = (int(input_shape),) if isinstance(input_shape, int) else tuple(int(s) for s in input_shape)
    calls = []
    hooks = [
        m.register_forward_hook(lambda m, inputs, output: calls.append((m, tuple(output.shape[1:]))))
        for m in module.modules()
        if isinstance(m, WEIGHT)
    ]
    p = next(module.parameters(), None)
    x = torch.zeros((1, *shape), dtype=p.dtype if p is not None else None, device=p.device if p is not None else None)
    probe_forward(module, (x,), hooks)
    return calls


def output_positions(layer, out_shape):
    """Output positions per example: ``L``, ``H * W`` or ``D * H * W`` for a conv (its output after the channels),
    the leading dims for a linear layer (1 for 2-d input)."""
    return math.prod(out_shape[1:]) if isinstance(layer, CONV) else math.prod(out_shape[:-1])


def flops(module, input_shape):
    """Floating point operations of one forward pass of one example of shape ``input_shape`` (no batch dim).

    Counted exactly: for every ``nn.Linear`` / ``L0Linear`` ``2 * in * out + out`` (one multiply and
    one add per multiply-add, plus one add per bias), for every ``nn.Conv2d`` / ``L0Conv2d``
    ``2 * (in_channels / groups) * kh * kw * out_channels * H_out * W_out + out_channels * H_out * W_out``
    (the last term only with a bias), and likewise for ``nn.Conv1d`` (kernel ``k``, output positions
    ``L_out``) and ``nn.Conv3d`` (``kd * kh * kw``, ``D_out * H_out * W_out``). Not counted: activations,
    pooling, flatten, index selects and the gate multiplications of the L0 layers; so an L0 network counts
    as its dense counterpart (all groups present) and a pruned one as its smaller layers. Returns an ``int``.
    """
    total = 0
    for layer, out_shape in weight_layer_calls(module, input_shape):
        n_in = in_units(layer) // (layer.groups if isinstance(layer, PLAIN_CONV) else 1)
        total += layer_flops(layer, n_in, out_units(layer), output_positions(layer, out_shape))
    return int(total)
