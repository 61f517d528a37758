"""The networks of the paper's MNIST experiments (Section 4.1), gated and dense.

Every network is an :class:`torch.nn.Sequential` with named children, so that
:func:`~l0bayes.pruning.prune.prune` can walk it and per-layer settings (e.g. the ``lam`` dictionary
of :func:`~l0bayes.nn.penalty.penalty`) can refer to ``"fc1"``, ``"conv2"``, ...
"""

from collections import OrderedDict
from numbers import Real

from torch import nn

from .layers import WEIGHT_INITS, L0Conv2d, L0Linear, _pair, init_weights_


def _dense(layer, weight_init):
    """A dense ``nn.Linear`` / ``nn.Conv2d``, re-initialised by ``weight_init`` (:func:`init_weights_`)."""
    if weight_init not in WEIGHT_INITS:
        raise ValueError(f"weight_init must be one of {WEIGHT_INITS}, got {weight_init!r}")
    if weight_init != "torch":
        init_weights_(layer.weight, layer.bias, weight_init)
    return layer


def _rates(init_drop_rates, n, what):
    if isinstance(init_drop_rates, Real):
        return (float(init_drop_rates),) * n
    rates = tuple(float(r) for r in init_drop_rates)
    if len(rates) != n:
        raise ValueError(f"{what} needs {n} init_drop_rates (one per gated layer), got {len(rates)}")
    return rates


class _MLPBase(nn.Sequential):
    def __init__(self, in_features, hidden, num_classes, make_linear):
        sizes = (int(in_features), *(int(h) for h in hidden), int(num_classes))
        layers = [("flatten", nn.Flatten())]
        for k in range(len(sizes) - 1):
            layers.append((f"fc{k + 1}", make_linear(k, sizes[k], sizes[k + 1])))
            if k < len(sizes) - 2:
                layers.append((f"relu{k + 1}", nn.ReLU()))
        super().__init__(OrderedDict(layers))
        self.in_features, self.hidden, self.num_classes = sizes[0], tuple(sizes[1:-1]), sizes[-1]


class L0MLP(_MLPBase):
    r"""The MLP 784-300-100-10 of Section 4.1 with an L0 gate on every input neuron of every layer.

    ``flatten -> fc1 -> relu1 -> fc2 -> relu2 -> fc3`` with :class:`L0Linear` layers, so the gates
    sit on the 784, 300 and 100 inputs (Table 1 reports e.g. ``219-214-100``). Accepts inputs of
    shape ``(B, in_features)`` or ``(B, C, H, W)`` with ``C * H * W = in_features``.

    :param init_drop_rates: one initial dropout rate per gated layer (a float for all); the
        default ``None`` is 0.2 on the inputs and 0.5 on every hidden layer, the original dropout
        rates of this MLP (Section 4): ``(0.2, 0.5, 0.5)`` for 784-300-100-10, ``(0.2, 0.5)`` for
        ``hidden=(20,)``.
    :param weight_init: ``"torch"`` (default) or ``"he"`` (the paper's code), see
        :func:`~l0bayes.nn.init_weights_`.
    :param gate_kwargs: ``temperature``, ``lower``, ``upper``, ``init_std`` for every gate.
    """

    def __init__(
        self,
        in_features=784,
        hidden=(300, 100),
        num_classes=10,
        init_drop_rates=None,
        weight_init="torch",
        **gate_kwargs,
    ):
        hidden = tuple(hidden)
        if init_drop_rates is None:
            init_drop_rates = (0.2,) + (0.5,) * len(hidden)
        rates = _rates(init_drop_rates, len(hidden) + 1, "L0MLP")
        super().__init__(
            in_features,
            hidden,
            num_classes,
            lambda k, n_in, n_out: L0Linear(
                n_in, n_out, init_drop_rate=rates[k], weight_init=weight_init, **gate_kwargs
            ),
        )


class MLP(_MLPBase):
    """The dense counterpart of :class:`L0MLP` (``nn.Linear`` only), same sizes and layer names."""

    def __init__(self, in_features=784, hidden=(300, 100), num_classes=10, weight_init="torch"):
        super().__init__(
            in_features, hidden, num_classes, lambda k, n_in, n_out: _dense(nn.Linear(n_in, n_out), weight_init)
        )


def lenet5_flat_size(input_size, conv_channels=(20, 50), kernel_size=5, padding=0):
    """Number of features after the second pooling of LeNet-5-Caffe for an input of ``input_size``.

    Each stage is a stride-1 convolution (``kernel_size``, ``padding``) followed by a 2x2 max
    pool (floor). Raises ``ValueError`` if a spatial size would not stay positive.
    """
    h, w = _pair(input_size)
    k, p = kernel_size, padding
    for stage in (1, 2):
        h, w = h + 2 * p - k + 1, w + 2 * p - k + 1
        if h < 1 or w < 1:
            raise ValueError(
                f"input_size={input_size} is too small for LeNet-5 (kernel_size={k}, padding={p}): conv{stage} "
                f"output would be {h}x{w}; use a larger padding (e.g. padding=2 for 8x8 inputs)"
            )
        h, w = h // 2, w // 2
        if h < 1 or w < 1:
            raise ValueError(
                f"input_size={input_size} is too small for LeNet-5 (kernel_size={k}, padding={p}): pool{stage} "
                f"output would be {h}x{w}; use a larger padding (e.g. padding=2 for 8x8 inputs)"
            )
    return conv_channels[1] * h * w


class _LeNetBase(nn.Sequential):
    def __init__(self, in_channels, num_classes, input_size, conv_channels, fc_hidden, kernel_size, padding, conv, fc):
        c1, c2 = (int(c) for c in conv_channels)
        flat = lenet5_flat_size(input_size, (c1, c2), kernel_size, padding)
        super().__init__(
            OrderedDict(
                [
                    ("conv1", conv(0, in_channels, c1)),
                    ("relu1", nn.ReLU()),
                    ("pool1", nn.MaxPool2d(2)),
                    ("conv2", conv(1, c1, c2)),
                    ("relu2", nn.ReLU()),
                    ("pool2", nn.MaxPool2d(2)),
                    ("flatten", nn.Flatten()),
                    ("fc1", fc(2, flat, fc_hidden)),
                    ("relu3", nn.ReLU()),
                    ("fc2", fc(3, fc_hidden, num_classes)),
                ]
            )
        )
        self.in_channels, self.num_classes, self.input_size = int(in_channels), int(num_classes), _pair(input_size)
        self.flat_features = flat


class L0LeNet5(_LeNetBase):
    r"""LeNet-5-Caffe (20-50-800-500, Section 4.1) with L0 gates.

    ``conv1 (L0Conv2d in->20, 5x5) -> relu -> maxpool 2 -> conv2 (L0Conv2d 20->50, 5x5) -> relu ->
    maxpool 2 -> flatten (800 for 28x28) -> fc1 (L0Linear 800->500) -> relu -> fc2 (L0Linear 500->10)``:
    a gate per output feature map of each convolution and per input neuron of each FC layer
    (Table 1 reports e.g. ``20-25-45-462``).

    Works for any ``input_size`` (int or ``(H, W)``) for which all spatial sizes stay positive;
    the flatten size is computed (:func:`lenet5_flat_size`). For 8x8 digits use ``padding=2``
    (8 -> 8 -> 4 -> 4 -> 2, flatten 200) or a smaller ``kernel_size``.

    :param init_drop_rates: one initial dropout rate per gated layer (conv1, conv2, fc1, fc2).
    :param weight_init: ``"torch"`` (default) or ``"he"`` (the paper's code), see
        :func:`~l0bayes.nn.init_weights_`.
    """

    def __init__(
        self,
        in_channels=1,
        num_classes=10,
        input_size=28,
        init_drop_rates=(0.5, 0.5, 0.5, 0.5),
        conv_channels=(20, 50),
        fc_hidden=500,
        kernel_size=5,
        padding=0,
        weight_init="torch",
        **gate_kwargs,
    ):
        rates = _rates(init_drop_rates, 4, "L0LeNet5")
        gate_kwargs["weight_init"] = weight_init
        super().__init__(
            in_channels,
            num_classes,
            input_size,
            conv_channels,
            fc_hidden,
            kernel_size,
            padding,
            lambda k, n_in, n_out: L0Conv2d(
                n_in, n_out, kernel_size, padding=padding, init_drop_rate=rates[k], **gate_kwargs
            ),
            lambda k, n_in, n_out: L0Linear(n_in, n_out, init_drop_rate=rates[k], **gate_kwargs),
        )


class LeNet5(_LeNetBase):
    """The dense counterpart of :class:`L0LeNet5` (``nn.Conv2d`` / ``nn.Linear``), same sizes and names."""

    def __init__(
        self,
        in_channels=1,
        num_classes=10,
        input_size=28,
        conv_channels=(20, 50),
        fc_hidden=500,
        kernel_size=5,
        padding=0,
        weight_init="torch",
    ):
        super().__init__(
            in_channels,
            num_classes,
            input_size,
            conv_channels,
            fc_hidden,
            kernel_size,
            padding,
            lambda k, n_in, n_out: _dense(nn.Conv2d(n_in, n_out, kernel_size, padding=padding), weight_init),
            lambda k, n_in, n_out: _dense(nn.Linear(n_in, n_out), weight_init),
        )
