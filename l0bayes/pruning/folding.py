"""A network prepared for CPU inference: batch norms folded into the convolutions before them, NHWC layout.

:func:`fold_batch_norm` merges every batch norm that only follows a convolution into it (the same function
in ``eval()`` mode, one pass over the activations fewer); :func:`for_inference` adds the ``channels_last``
memory format. Apply them to a dense network and to its pruned version alike when comparing their speed.
"""

import copy

import torch
from torch import nn

__all__ = ["fold_batch_norm", "for_inference"]


def _folded(conv, bn):
    r"""A copy of ``conv`` computing ``bn(conv(x))`` of an eval-mode batch norm.

    :math:`\mathrm{BN}(W \star x + b) = (s \odot W) \star x + s \odot (b - \mu) + \beta` with
    :math:`s = \gamma / \sqrt{\sigma^2 + \epsilon}`, per output channel (computed in float64).
    """
    folded = copy.deepcopy(conv)
    with torch.no_grad():
        scale = (bn.running_var.double() + bn.eps).rsqrt()
        if bn.weight is not None:
            scale = scale * bn.weight.double()
        shift = -bn.running_mean.double() * scale
        if bn.bias is not None:
            shift = shift + bn.bias.double()
        if conv.bias is not None:
            shift = shift + conv.bias.double() * scale
        shape = (-1,) + (1,) * (conv.weight.dim() - 1)
        folded.weight = nn.Parameter((conv.weight.double() * scale.view(shape)).to(conv.weight.dtype))
        folded.bias = nn.Parameter(shift.to(conv.weight.dtype))
    return folded


def fold_batch_norm(module):
    r"""An ``eval()``-mode copy of ``module`` with every batch norm that only follows a convolution folded into it.

    Traces ``module`` with ``torch.fx``; where the output of an ``nn.Conv1d/2d/3d`` (called once) goes
    only to a batch norm with running statistics, the pair becomes one convolution with weights
    :math:`s \odot W` and bias :math:`s \odot (b - \mu) + \beta`, :math:`s = \gamma / \sqrt{\sigma^2 +
    \epsilon}`: the same function in ``eval()`` mode, one pass over the activations fewer. In the Wide
    ResNet that is every block's ``bn2`` (after ``conv1``); the pre-activation ``bn1`` follows a residual
    addition and stays. ``module`` is not changed.

    :returns: a ``torch.fx.GraphModule`` in ``eval()`` mode.
    """
    graph_module = torch.fx.symbolic_trace(copy.deepcopy(module).eval())
    modules = dict(graph_module.named_modules())
    calls = {}
    for node in graph_module.graph.nodes:
        if node.op == "call_module":
            calls[node.target] = calls.get(node.target, 0) + 1
    for node in list(graph_module.graph.nodes):
        bn = modules.get(node.target) if node.op == "call_module" else None
        if not isinstance(bn, nn.modules.batchnorm._BatchNorm) or bn.running_mean is None or len(node.args) != 1:
            continue
        source = node.args[0]
        conv = modules.get(source.target) if isinstance(source, torch.fx.Node) and source.op == "call_module" else None
        if (
            not isinstance(conv, (nn.Conv1d, nn.Conv2d, nn.Conv3d))
            or len(source.users) != 1
            or calls[source.target] != 1
        ):
            continue
        graph_module.set_submodule(source.target, _folded(conv, bn))
        node.replace_all_uses_with(source)
        graph_module.graph.erase_node(node)
    graph_module.graph.lint()
    graph_module.delete_all_unused_submodules()
    graph_module.recompile()
    return graph_module.eval()


def for_inference(module, channels_last=True, fold=True):
    """A copy of ``module`` prepared for CPU inference: batch norms folded, tensors in ``channels_last`` order.

    Apply it to a dense network and to its pruned version alike when comparing their speed. Feed
    the result ``x.contiguous(memory_format=torch.channels_last)`` (or any layout; PyTorch converts).

    :param channels_last: store 4-d weights (and so the activations) as NHWC, where oneDNN's
        convolutions are faster than in NCHW, above all for convolutions with few channels, such as a
        pruned network's.
    :param fold: fold batch norms into the convolutions before them (:func:`fold_batch_norm`).
    """
    out = fold_batch_norm(module) if fold else copy.deepcopy(module).eval()
    return out.to(memory_format=torch.channels_last) if channels_last else out
