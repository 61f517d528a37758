r"""The products of the gated layers, computing only the groups whose gate is open.

A gate drawn from the hard concrete (Eq. 10-11) is exactly 0 with probability :math:`\bar Q(0)`
(Eq. 12). The input columns of an :class:`~l0bayes.nn.L0Linear` and the output maps of an
:class:`~l0bayes.nn.L0Conv2d` whose gate is 0 contribute nothing to the layer's output, so they
need not be computed: the conditional computation that Sections 2.4 and 3 of the paper point to
("sparsification happens during training, thus theoretically allowing conditional computation to
speed-up training"). The functions here compute

.. math::
    y = (x \odot z) W^\top + b \qquad\text{and}\qquad y_{:, c} = z_c (W_c \star x + b_c)

from the open groups alone, with the same value and the same gradients (with respect to ``x``,
``W``, ``b`` and the open gates) as the full computation for the same draw ``z``. The gradient
with respect to the *value* of a closed gate is returned as 0: every gate of this package is the
hard sigmoid of Eq. 11, whose derivative vanishes wherever it is 0 (:math:`\bar s < 0`), so the
gradients of ``log_alpha`` are unchanged (see the docs' mathematics page, docs/mathematics.md,
on the hard concrete gate).

Whether the compact product pays is decided per call by a measured rule (:func:`use_compact`):
it pays on a CPU once enough groups are closed, since it gathers the open columns of ``x`` and
``W`` and scatters the gradient back; it is never used on a GPU in ``"auto"`` mode (counting the
open gates would synchronise the device every step), nor inside :func:`torch.compile` (the number of
open groups would be a data-dependent shape).
"""

import torch
import torch.nn.functional as F

#: ``"auto"``: the measured rule of :func:`use_compact`; ``True``: whenever a gate is closed;
#: ``False``: never. Set per layer through its ``conditional`` attribute.
CONDITIONAL_MODES = ("auto", True, False)

#: Largest fraction of open input columns at which the compact :class:`L0Linear` product is used
#: in ``"auto"`` mode (CPU). Measured with ``benchmarks/bench_training.py --curve``: below it the
#: gathered product plus scatter is faster than the full one (benchmarks/RESULTS.md, "Step time
#: against the fraction of closed groups").
LINEAR_OPEN_FRACTION = 0.5
#: The same for the output maps of :class:`L0Conv2d`.
CONV_OPEN_FRACTION = 0.5


def use_compact(z, mode, max_open_fraction, num_open=None):
    """The indices of the open gates (``z != 0``) if the compact product is to be used, else ``None``.

    :param z: the gate values, one per group (1-d).
    :param mode: one of :data:`CONDITIONAL_MODES`.
    :param float max_open_fraction: the ``"auto"`` threshold on the fraction of open gates.
    :param int num_open: the number of nonzero gates if already known
        (:meth:`~l0bayes.nn.gate_set.GateSet.sampled` counts them for all layers in one pass).
    """
    if mode is False or z.dim() != 1 or torch.compiler.is_compiling():
        return None  # (under torch.compile the size of the open set would be a data-dependent shape)
    if mode == "auto" and z.device.type != "cpu":
        return None
    if num_open is None:
        num_open = int(torch.count_nonzero(z))
    if num_open == z.numel():
        return None
    if mode == "auto" and num_open > max_open_fraction * z.numel():
        return None
    return z.nonzero().squeeze(-1)


class _GatedInput(torch.autograd.Function):
    r""":math:`y = (x \odot z) W^\top + b` for an input ``x`` that needs no gradient (a first layer).

    The weight gradient is formed from the gated input, :math:`\bar W = \bar y^\top (x \odot z)`, the
    product a dense layer forms anyway, and the gates' gradient is read off it:
    :math:`\bar z_i = \sum_o (\bar y^\top x)_{oi} W_{oi} = \frac{1}{z_i} \sum_o \bar W_{oi} W_{oi}` for an
    open gate. This spares autograd's ``B x out x in`` product :math:`\bar y W` (the gradient of the
    gated input) and the two extra passes over ``W`` of the form :math:`x (W \operatorname{diag} z)^\top`.
    A closed gate (:math:`z_i = 0`) gets 0, as from the compact product: the hard sigmoid of Eq. 11
    is flat wherever a gate is 0. Accurate to the dtype's relative precision while :math:`x z` does
    not underflow (a hard concrete gate that is not 0 is at least about the dtype's epsilon times
    :math:`|\gamma|`). Not twice differentiable.
    """

    @staticmethod
    def forward(ctx, x, z, weight, bias):
        xz = x * z
        ctx.save_for_backward(xz, z, weight)
        return F.linear(xz, weight, bias)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_y):
        xz, z, weight = ctx.saved_tensors
        _, need_z, need_w, need_b = ctx.needs_input_grad
        g2 = grad_y.reshape(-1, grad_y.shape[-1])
        grad_w = g2.t().mm(xz.reshape(g2.shape[0], -1))
        grad_z = (grad_w * weight).sum(0).div_(z).masked_fill_(z == 0, 0.0) if need_z else None
        return None, grad_z, grad_w if need_w else None, g2.sum(0) if need_b else None


def _scale_weight(x, weight):
    """Whether to scale ``weight``'s columns by the gates rather than the input ``x``: the smaller of the two.

    Both give the same product; the scaled tensor and its gradient are the extra passes over memory.
    """
    return weight.numel() < x.numel()


def gated_linear(x, z, weight, bias=None, mode="auto", num_open=None):
    r""":math:`(x \odot z) W^\top + b`, computing only the open input columns when that pays.

    :param x: input ``(..., in)``; :param z: gates ``(in,)``; :param weight: ``(out, in)``;
    :param bias: ``(out,)`` or ``None``; :param mode: one of :data:`CONDITIONAL_MODES`;
    :param num_open: the number of nonzero entries of ``z`` if known (see :func:`use_compact`).

    An input that needs no gradient (a first layer) with gates that do takes :class:`_GatedInput`;
    otherwise autograd differentiates :math:`(x \odot z) W^\top` or :math:`x\,(W \operatorname{diag}
    z)^\top`, whichever scales fewer numbers. With open columns selected, the gradients of the closed
    columns of ``x`` and ``W`` are exact zeros (``index_select``'s backward), as in the full product.
    A gate tensor with a sample dimension (``z`` of more than one dimension, as under a Pyro plate over
    particles) takes the general path.
    """
    if z.dim() != 1:
        return F.linear(x * z, weight, bias)
    columns = use_compact(z, mode, LINEAR_OPEN_FRACTION, num_open)
    if columns is not None:
        x, z, weight = x.index_select(-1, columns), z.index_select(0, columns), weight.index_select(1, columns)
    if torch.is_grad_enabled() and z.requires_grad and not x.requires_grad:
        return _GatedInput.apply(x, z, weight, bias)
    if _scale_weight(x, weight):
        return F.linear(x, weight * z, bias)
    return F.linear(x * z, weight, bias)


def gated_conv2d(x, z, weight, bias, stride, padding, dilation, mode="auto", num_open=None):
    r""":math:`y_{:, c} = z_c (W_c \star x + b_c)`, convolving only the open output maps when that pays.

    The closed maps of the output are exact zeros (a tensor of the full shape is returned).
    """
    if z.dim() != 1:
        y = F.conv2d(x, weight, bias, stride, padding, dilation)
        return y * z[..., :, None, None]
    columns = use_compact(z, mode, CONV_OPEN_FRACTION, num_open)
    if columns is None or not columns.numel():  # (no open map: the output shape is the full path's)
        return F.conv2d(x, *_scaled_maps(z, weight, bias), stride, padding, dilation)
    z_open = z.index_select(0, columns)
    w_open = weight.index_select(0, columns)
    b_open = None if bias is None else bias.index_select(0, columns)
    y_open = F.conv2d(x, *_scaled_maps(z_open, w_open, b_open), stride, padding, dilation)
    shape = list(y_open.shape)
    shape[-3] = weight.shape[0]
    return y_open.new_zeros(shape).index_copy(-3, columns, y_open)


def _scaled_maps(z, weight, bias):
    r"""``(z_c W_c, z_c b_c)``: the gated maps as scaled filters.

    :math:`z_c (W_c \star x + b_c) = (z_c W_c) \star x + z_c b_c`.

    Scaling the filters (``out x in x kh x kw`` numbers) rather than the output (``B x out x H x W``)
    gives the same maps, exactly 0 where a gate is 0, at a fraction of the arithmetic.
    """
    scaled = weight * z[:, None, None, None]
    return scaled, None if bias is None else bias * z
