r"""Linear and convolutional layers with hard concrete group gates (Sections 2.3-2.4, Eq. 12-17).

Both layers follow the paper's "neuron sparsity" (Section 2.4): one gate per *input neuron* of a
fully connected layer and one gate per *output feature map* of a convolution. The gate is a
:class:`~l0bayes.nn.gates.HardConcreteGate` held as ``self.gate``; calling the layer draws
``z = self.gate()`` once per call (a reparameterised sample in ``train()`` mode, Eq. 13 in
``eval()`` mode, a ``pyro.sample`` site inside :func:`~l0bayes.nn.gates.pyro_gates`).
"""

import math

import torch
import torch.nn.functional as F
from torch import nn

from .gated_ops import CONDITIONAL_MODES, gated_conv2d, gated_linear
from .gates import HardConcreteGate

WEIGHT_INITS = ("torch", "he")


def init_weights_(weight, bias=None, scheme="torch"):
    r"""Initialise a linear or convolutional layer's ``weight`` (``(out, in, ...)``) and ``bias`` in place.

    ``"torch"``: the initialisation of :class:`torch.nn.Linear` / :class:`torch.nn.Conv2d`, uniform with
    standard deviation :math:`1/\sqrt{3\,\mathrm{fan\_in}}` for the weights and bound
    :math:`1/\sqrt{\mathrm{fan\_in}}` for the bias. ``"he"``: He et al.'s normal initialisation,
    :math:`N(0, 2/\mathrm{fan\_in})`, and zero bias, as in the paper's public code (whose dense layers store
    the weight transposed and call it with ``mode="fan_out"``, which is the fan-in there). ``fan_in`` is
    ``in * kh * kw``.
    """
    if scheme not in WEIGHT_INITS:
        raise ValueError(f"weight_init must be one of {WEIGHT_INITS}, got {scheme!r}")
    fan_in = weight[0].numel()
    with torch.no_grad():
        if scheme == "he":
            nn.init.kaiming_normal_(weight, mode="fan_in", nonlinearity="relu")
            if bias is not None:
                bias.zero_()
            return
        nn.init.kaiming_uniform_(weight, a=math.sqrt(5))
        if bias is not None:
            bound = 1.0 / math.sqrt(fan_in) if fan_in > 0 else 0.0
            nn.init.uniform_(bias, -bound, bound)


def _pair(value):
    if isinstance(value, (tuple, list)):
        if len(value) != 2:
            raise ValueError(f"expected an int or a pair, got {value!r}")
        return tuple(int(v) for v in value)
    return (int(value), int(value))


class L0Layer(nn.Module):
    r"""Base class of the gated layers: a weight tensor whose groups share the gates of ``self.gate``.

    Subclasses set ``self.gate`` (a :class:`HardConcreteGate` with ``group_size`` = :math:`|g|`,
    the number of *weights* per group) and implement :meth:`expected_l2`.
    """

    gate: HardConcreteGate

    #: Conditional computation (:mod:`l0bayes.nn.gated_ops`): ``"auto"`` computes only the groups
    #: whose sampled gate is open when a measured rule says it pays, ``True`` whenever a gate is
    #: closed, ``False`` never. Exact in every mode (same loss and parameter gradients).
    conditional = "auto"

    def set_conditional(self, mode):
        """Set :attr:`conditional` (one of ``"auto"``, ``True``, ``False``); returns ``self``."""
        if not any(mode is m or (isinstance(m, str) and mode == m) for m in CONDITIONAL_MODES):
            raise ValueError(f"conditional must be one of {CONDITIONAL_MODES}, got {mode!r}")
        self.conditional = mode
        return self

    @property
    def num_gates(self):
        """Number of gates :math:`|G|` (input neurons for :class:`L0Linear`, output maps for :class:`L0Conv2d`)."""
        return self.gate.num_gates

    @property
    def group_size(self):
        """Number of weights :math:`|g|` sharing one gate."""
        return self.gate.group_size

    def prob_nonzero(self):
        r"""Eq. 12 per gate: :math:`q(z_g \ne 0) = \sigma(\log\alpha_g - \beta\log(-\gamma/\zeta))`."""
        return self.gate.prob_nonzero()

    def gate_values(self):
        """Eq. 13: the deterministic test-time gate values (in ``[0, 1]``, exactly 0 for pruned groups)."""
        return self.gate.deterministic()

    def active_mask(self):
        """Boolean mask of the groups kept at test time (Eq. 13 gate > 0)."""
        return self.gate.active()

    def expected_l0(self):
        r"""Eq. 16: :math:`\sum_g |g|\, q(z_g \ne 0)`, the expected number of active gated weights.

        Only the gated weights are counted; ungated parameters (the bias of :class:`L0Linear`, or
        the bias of a conv map, see :class:`L0Conv2d`) are not part of :math:`|g|`.
        """
        return self.gate.expected_l0()

    def expected_l2(self):  # pragma: no cover - abstract
        raise NotImplementedError


class L0Linear(L0Layer):
    r"""Fully connected layer with one hard concrete gate per input neuron (Section 2.4).

    .. math::
        y = (x \odot z)\, W^\top + b, \qquad z = \text{self.gate}() \in [0, 1]^{\text{in}},

    i.e. :math:`\theta = \tilde\theta \odot z` with the gate of input neuron :math:`i` shared by
    the ``out_features`` weights of column :math:`W_{:, i}` (group size :math:`|g|` =
    ``out_features``). The bias is not gated.

    :param init_drop_rate: initial dropout rate; ``log_alpha`` starts at
        :math:`N(\mathrm{logit}(1 - d), 0.01^2)` (Section 4, :func:`~l0bayes.nn.gates.init_log_alpha`).
    :param temperature: :math:`\beta`; ``lower``, ``upper``: :math:`\gamma, \zeta` (Eq. 10).
    :param weight_init: ``"torch"`` (default, as :class:`torch.nn.Linear`) or ``"he"`` (the paper's code),
        see :func:`init_weights_`.
    """

    def __init__(
        self,
        in_features,
        out_features,
        bias=True,
        init_drop_rate=0.5,
        temperature=2.0 / 3.0,
        lower=-0.1,
        upper=1.1,
        init_std=0.01,
        weight_init="torch",
    ):
        super().__init__()
        self.weight_init = weight_init  # checked by init_weights_ in reset_parameters
        self.in_features, self.out_features = int(in_features), int(out_features)
        self.weight = nn.Parameter(torch.empty(self.out_features, self.in_features))
        if bias:
            self.bias = nn.Parameter(torch.empty(self.out_features))
        else:
            self.register_parameter("bias", None)
        self.gate = HardConcreteGate(
            self.in_features,
            group_size=self.out_features,
            init_drop_rate=init_drop_rate,
            temperature=temperature,
            lower=lower,
            upper=upper,
            init_std=init_std,
        )
        self.reset_parameters()

    def reset_parameters(self):
        """Weights and bias by ``weight_init`` (:func:`init_weights_`); the gate is left untouched."""
        init_weights_(self.weight, self.bias, self.weight_init)

    def extra_repr(self):
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"

    def forward(self, x):
        # Scaling x (batch x in) rather than W's columns (out x in), with the gates' gradient taken
        # from the weight gradient when x needs none, and only the open columns when that pays
        # (l0bayes.nn.gated_ops).
        if x.shape[-1] != self.in_features:  # (the compact product would fail with an index error)
            raise ValueError(
                f"L0Linear(in_features={self.in_features}, out_features={self.out_features}) got an input of "
                f"{x.shape[-1]} features (shape {tuple(x.shape)})"
            )
        gate = self.gate
        if gate.observer is not None:
            gate.observer(x, -1, self)
        z = gate()
        return gated_linear(x, z, self.weight, self.bias, self.conditional, gate.num_open(z))

    def expected_l2(self):
        r"""Eq. 17 (Eq. 15 per group): :math:`\sum_g q(z_g \ne 0) \sum_{j \in g} \tilde\theta_j^2 + \|b\|^2`.

        The group of input neuron :math:`i` is the column :math:`W_{:, i}`; the ungated bias
        enters with :math:`q = 1`, i.e. as plain weight decay.
        """
        out = (self.prob_nonzero() * self.weight.pow(2).sum(0)).sum()
        if self.bias is not None:
            out = out + self.bias.pow(2).sum()
        return out


class L0Conv2d(L0Layer):
    r"""2-d convolution with one hard concrete gate per output feature map (Section 2.4).

    .. math::
        y_{:, c} = z_c \left(W_c \star x + b_c\right), \qquad z = \text{self.gate}() \in [0, 1]^{\text{out}},

    the gate shared across all locations of map :math:`c` (akin to spatial dropout). The
    *whole* map, bias included, is multiplied by :math:`z_c`, so a closed map is exactly zero
    and removing it (and the matching input channels of the next layer) is exact.

    Group size :math:`|g|` = ``in_channels * kh * kw``, the weights of one map; the map's bias
    is gated with them but, by convention, counted in :meth:`expected_l2` and not in
    :meth:`expected_l0` (Eq. 16 counts weights only). ``weight_init`` as for :class:`L0Linear`.
    """

    def __init__(
        self,
        in_channels,
        out_channels,
        kernel_size,
        stride=1,
        padding=0,
        dilation=1,
        bias=True,
        init_drop_rate=0.5,
        temperature=2.0 / 3.0,
        lower=-0.1,
        upper=1.1,
        init_std=0.01,
        weight_init="torch",
    ):
        super().__init__()
        self.weight_init = weight_init  # checked by init_weights_ in reset_parameters
        self.in_channels, self.out_channels = int(in_channels), int(out_channels)
        self.kernel_size = _pair(kernel_size)
        self.stride = _pair(stride)
        self.padding = padding if isinstance(padding, str) else _pair(padding)
        self.dilation = _pair(dilation)
        kh, kw = self.kernel_size
        self.weight = nn.Parameter(torch.empty(self.out_channels, self.in_channels, kh, kw))
        if bias:
            self.bias = nn.Parameter(torch.empty(self.out_channels))
        else:
            self.register_parameter("bias", None)
        self.gate = HardConcreteGate(
            self.out_channels,
            group_size=self.in_channels * kh * kw,
            init_drop_rate=init_drop_rate,
            temperature=temperature,
            lower=lower,
            upper=upper,
            init_std=init_std,
        )
        self.reset_parameters()

    def reset_parameters(self):
        """Weights and bias by ``weight_init`` (:func:`init_weights_`); the gate is left untouched."""
        init_weights_(self.weight, self.bias, self.weight_init)

    def extra_repr(self):
        return (
            f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}, "
            f"padding={self.padding}, dilation={self.dilation}, bias={self.bias is not None}"
        )

    def forward(self, x):
        gate = self.gate
        if gate.observer is not None:  # the maps before their gates, computed only for the observer
            gate.observer(F.conv2d(x, self.weight, self.bias, self.stride, self.padding, self.dilation), 1, None)
        z = gate()
        return gated_conv2d(
            x, z, self.weight, self.bias, self.stride, self.padding, self.dilation, self.conditional,
            gate.num_open(z),
        )  # fmt: skip

    def expected_l2(self):
        r"""Eq. 17: :math:`\sum_c q(z_c \ne 0) \left(\sum_{j \in g_c} \tilde\theta_j^2 + b_c^2\right)`.

        The bias of map :math:`c` is gated with the map, so it belongs to its group here.
        """
        group_sq = self.weight.pow(2).sum((1, 2, 3))
        if self.bias is not None:
            group_sq = group_sq + self.bias.pow(2)
        return (self.prob_nonzero() * group_sq).sum()
