"""The linear layers a transformer block is made of: ``nn.Linear``, and the ``Conv1D`` of Hugging Face's GPT-2.

Hugging Face's ``Conv1D`` (``transformers.pytorch_utils.Conv1D``) is a linear layer that stores its weight as
``(in, out)`` and always has a bias. It is recognised by its class name and attributes, so nothing here
imports ``transformers``. Every helper speaks in the ``nn.Linear`` orientation: a weight is ``(out, in)``.
"""

import copy

from torch import nn

from ..counting import layer_flops


def is_conv1d(module):
    """Whether ``module`` is Hugging Face's ``Conv1D``: a linear layer with its weight stored ``(in, out)``."""
    weight = getattr(module, "weight", None)
    return (
        type(module).__name__ == "Conv1D"
        and isinstance(getattr(module, "nf", None), int)
        and isinstance(weight, nn.Parameter)
        and weight.dim() == 2
        and weight.shape[1] == module.nf
    )


def is_projection(module):
    """An ``nn.Linear`` or a Hugging Face ``Conv1D``."""
    return isinstance(module, nn.Linear) or is_conv1d(module)


def features(module):
    """``(in_features, out_features)`` of a projection."""
    if isinstance(module, nn.Linear):
        return module.in_features, module.out_features
    return tuple(module.weight.shape)


def out_dim(module):
    """The dimension of the stored weight that indexes output features (0 for ``nn.Linear``, 1 for ``Conv1D``)."""
    return 1 if is_conv1d(module) else 0


def weight(module):
    """The weight as ``(out, in)`` (a view for ``Conv1D``)."""
    return module.weight.t() if is_conv1d(module) else module.weight


def like(module, weight, bias):
    """A new projection of ``module``'s kind holding ``weight`` (``(out, in)``) and ``bias`` (copied)."""
    if is_conv1d(module):
        new = copy.deepcopy(module)
        new.weight = nn.Parameter(weight.t().contiguous().clone())
        new.bias = nn.Parameter((bias if bias is not None else weight.new_zeros(weight.shape[0])).clone())
        new.nf = int(weight.shape[0])
        if isinstance(getattr(module, "nx", None), int):
            new.nx = int(weight.shape[1])
        return new
    new = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, device=weight.device, dtype=weight.dtype)
    new.weight.data.copy_(weight)
    if bias is not None:
        new.bias.data.copy_(bias)
    return new


def flops(module):
    """FLOPs of one call at one position, as :func:`~l0bayes.pruning.flops` counts: ``2 * in * out + out``."""
    return layer_flops(module, *features(module), 1)
