"""An ``nn.Sequential`` of weight layers cut into segments: the walk of :func:`~l0bayes.pruning.prune` and the FLOPs.

The walk is generic over an :class:`torch.nn.Sequential` (nested ones are flattened) of
:class:`~l0bayes.nn.L0Linear`, :class:`~l0bayes.nn.L0Conv2d`, ``nn.Linear``, ``nn.Conv1d`` / ``nn.Conv2d`` /
``nn.Conv3d`` (``groups=1``), ``nn.Flatten`` and channel-wise layers (activations, pooling, dropout). The network is
cut into *segments*: the tensor flowing from one weight layer (the producer, or the network input)
through channel-wise layers and at most a flatten into the next weight layer (the consumer, or the
network output).
"""

from dataclasses import dataclass, field

from torch import nn

from ..nn.layers import L0Conv2d, L0Linear

__all__ = [
    "CHANNELWISE",
    "CONV",
    "PLAIN_CONV",
    "LINEAR",
    "WEIGHT",
    "ZERO_PRESERVING",
    "Segment",
    "in_units",
    "leaves",
    "out_units",
    "segments",
]

LINEAR = (L0Linear, nn.Linear)
#: The convolutions of torch (not the transposed ones), of every spatial dimension.
PLAIN_CONV = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
CONV = (L0Conv2d, *PLAIN_CONV)
WEIGHT = LINEAR + CONV
# Channel-wise layers with f(0) = 0 on a whole map: a zero map stays a zero map.
ZERO_PRESERVING = (
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
    nn.Dropout1d,
    nn.Dropout2d,
    nn.Dropout3d,
    nn.MaxPool1d,
    nn.MaxPool2d,
    nn.MaxPool3d,
    nn.AvgPool1d,
    nn.AvgPool2d,
    nn.AvgPool3d,
    nn.AdaptiveAvgPool1d,
    nn.AdaptiveAvgPool2d,
    nn.AdaptiveAvgPool3d,
    nn.AdaptiveMaxPool1d,
    nn.AdaptiveMaxPool2d,
    nn.AdaptiveMaxPool3d,
)
# Channel-wise but f(0) != 0: units pass through unchanged in number, zeros are not zeros after.
CHANNELWISE = (nn.Sigmoid, nn.Softplus)


def leaves(module, prefix=""):
    """``(name, layer)`` for the leaves of (nested) ``nn.Sequential`` s; names joined with ``_``."""
    if isinstance(module, nn.Sequential):
        out = []
        for name, child in module.named_children():
            out.extend(leaves(child, f"{prefix}{name}_"))
        return out
    name = prefix[:-1] if prefix else "layer"
    if isinstance(module, PLAIN_CONV) and module.groups != 1:
        raise NotImplementedError(f"{name}: grouped convolutions are not supported")
    if isinstance(module, nn.Flatten) and (module.start_dim != 1 or module.end_dim != -1):
        raise NotImplementedError(f"{name}: only nn.Flatten(start_dim=1, end_dim=-1) is supported")
    if not isinstance(module, WEIGHT + ZERO_PRESERVING + CHANNELWISE + (nn.Flatten,)):
        raise TypeError(
            f"{name}: {type(module).__name__} is not supported; the walk handles an nn.Sequential of "
            "L0Linear, L0Conv2d, nn.Linear, nn.Conv1d/2d/3d, nn.Flatten and channel-wise activations, pooling, dropout"
        )
    return [(name, module)]


def in_units(layer):
    """Input features of a linear layer, input channels of a convolution."""
    return layer.in_features if isinstance(layer, LINEAR) else layer.in_channels


def out_units(layer):
    """Output features of a linear layer, output channels of a convolution."""
    return layer.out_features if isinstance(layer, LINEAR) else layer.out_channels


@dataclass
class Segment:
    """The tensor between two weight layers of the walk (see the module docstring)."""

    producer: int | None  # index of the producing weight layer in the leaves; None: network input
    consumer: int | None  # index of the consuming weight layer; None: network output
    ops: list = field(default_factory=list)
    hw: int = 1  # consumer units per producer unit (h * w of a flattened map)
    zero_preserving: bool = True


def segments(layers):
    """The :class:`Segment` s of ``layers`` (the ``(name, layer)`` list of :func:`leaves`), unit counts checked."""
    out, current = [], Segment(None, None)
    for i, (_, leaf) in enumerate(layers):
        if isinstance(leaf, WEIGHT):
            current.consumer = i
            out.append(current)
            current = Segment(i, None)
        else:
            current.ops.append(leaf)
    out.append(current)
    for seg in out:
        seg.zero_preserving = all(isinstance(op, ZERO_PRESERVING + (nn.Flatten,)) for op in seg.ops)
        flattens = any(isinstance(op, nn.Flatten) for op in seg.ops)
        if seg.consumer is not None and flattens and isinstance(layers[seg.consumer][1], CONV):
            raise NotImplementedError(f"{layers[seg.consumer][0]}: a convolution after nn.Flatten is not supported")
        if seg.producer is None or seg.consumer is None:
            continue
        (pname, prod), (cname, cons) = layers[seg.producer], layers[seg.consumer]
        n_prod, n_cons = out_units(prod), in_units(cons)
        from_map = isinstance(prod, CONV) and isinstance(cons, LINEAR)
        if from_map and not flattens:
            raise ValueError(f"{pname} -> {cname}: a linear layer after a convolution needs an nn.Flatten")
        if n_cons % n_prod or (n_cons != n_prod and not from_map):
            raise ValueError(f"{pname} -> {cname}: {n_prod} output units do not match {n_cons} input units")
        seg.hw = n_cons // n_prod
    return out
