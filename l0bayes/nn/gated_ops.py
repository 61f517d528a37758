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
open gates would synchronise the device every step).
"""

import torch
import torch.nn.functional as F

#: ``"auto"``: the measured rule of :func:`use_compact`; ``True``: whenever a gate is closed;
#: ``False``: never. Set per layer through its ``conditional`` attribute.
CONDITIONAL_MODES = ("auto", True, False)

#: Largest fraction of open input columns at which the compact :class:`L0Linear` product is used
#: in ``"auto"`` mode (CPU). Measured with ``benchmarks/bench_training.py --curve``: below it the
#: gathered product plus scatter is faster than the full one (benchmarks/RESULTS.md, issue 13).
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
    if mode is False or z.dim() != 1:
        return None
    if mode == "auto" and z.device.type != "cpu":
        return None
    if num_open is None:
        num_open = int(torch.count_nonzero(z))
    if num_open == z.numel():
        return None
    if mode == "auto" and num_open > max_open_fraction * z.numel():
        return None
    return z.nonzero().squeeze(-1)


class _GatedLinear(torch.autograd.Function):
    r""":math:`y = (x \odot z) W^\top + b` with a hand-written backward.

    When ``x`` needs no gradient (a first layer), the gradient of the gates uses the weight
    gradient already needed, :math:`G = \bar y^\top x` (:math:`\bar y` the output gradient):
    :math:`\bar W = G \odot z` and :math:`\bar z_i = \sum_o G_{oi} W_{oi}`, which spares the
    ``B x out x in`` product :math:`\bar y W` that autograd would form for the gated input.
    With ``columns`` (indices of the open gates) only those columns of ``x`` and ``W`` enter.
    Not twice differentiable (raises if asked).
    """

    @staticmethod
    def forward(ctx, x, z, weight, bias, columns):
        if columns is not None:
            x_in, z_in, w_in = x.index_select(-1, columns), z.index_select(0, columns), weight.index_select(1, columns)
        else:
            x_in, z_in, w_in = x, z, weight
        xz = x_in * z_in
        ctx.columns = columns
        ctx.in_features = weight.shape[1]
        ctx.has_bias = bias is not None
        if ctx.needs_input_grad[0]:
            ctx.save_for_backward(x_in, z_in, w_in, xz)
        else:
            ctx.save_for_backward(x_in, z_in, w_in, None)
        return F.linear(xz, w_in, bias)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_y):
        x_in, z_in, w_in, xz = ctx.saved_tensors
        need_x, need_z, need_w, need_b, _ = ctx.needs_input_grad
        grad_x = grad_z = grad_w = grad_b = None
        g2 = grad_y.reshape(-1, grad_y.shape[-1])
        # The products are fresh tensors, scaled in place once the gates' gradient has used them
        # (on a loaded CPU each fresh out x in buffer costs page faults comparable to the arithmetic).
        if need_x:
            grad_xz = grad_y.matmul(w_in)
            if need_z:
                grad_z = (grad_xz * x_in).reshape(g2.shape[0], x_in.shape[-1]).sum(0)
            grad_x = grad_xz.mul_(z_in)
            if need_w:
                grad_w = g2.t().matmul(xz.reshape(g2.shape[0], xz.shape[-1]))
        elif need_z or need_w:
            g = g2.t().matmul(x_in.reshape(g2.shape[0], x_in.shape[-1]))
            grad_z = torch.linalg.vecdot(g.t(), w_in.t()) if need_z else None
            grad_w = g.mul_(z_in) if need_w else None
        if need_b:
            grad_b = g2.sum(0)
        columns = ctx.columns
        if columns is not None:
            grad_x = _scatter_columns(grad_x, columns, ctx.in_features)
            grad_z = _scatter_columns(grad_z, columns, ctx.in_features)
            grad_w = _scatter_columns(grad_w, columns, ctx.in_features)
        return grad_x, grad_z, grad_w, grad_b, None


def _scatter_columns(values, columns, size):
    """A tensor with ``values`` in the last-dimension positions ``columns`` and zeros elsewhere."""
    if values is None:
        return None
    out = values.new_zeros(values.shape[:-1] + (size,))
    return out.index_copy_(-1, columns, values)


def gated_linear(x, z, weight, bias=None, mode="auto", num_open=None):
    r""":math:`(x \odot z) W^\top + b`, computing only the open input columns when that pays.

    :param x: input ``(..., in)``; :param z: gates ``(in,)``; :param weight: ``(out, in)``;
    :param bias: ``(out,)`` or ``None``; :param mode: one of :data:`CONDITIONAL_MODES`;
    :param num_open: the number of nonzero entries of ``z`` if known (see :func:`use_compact`).

    A gate tensor with a sample dimension (``z`` of more than one dimension, as under a Pyro
    plate over particles) takes autograd's general path.
    """
    if z.dim() != 1:
        return F.linear(x * z, weight, bias)
    columns = use_compact(z, mode, LINEAR_OPEN_FRACTION, num_open)
    if columns is None and x.requires_grad and torch.is_grad_enabled():
        # A hidden layer needs the input gradient anyway, from which autograd takes the gates' own:
        # the hand-written backward would only add its Python overhead.
        return F.linear(x * z, weight, bias)
    return _GatedLinear.apply(x, z, weight, bias, columns)


def gated_conv2d(x, z, weight, bias, stride, padding, dilation, mode="auto", num_open=None):
    r""":math:`y_{:, c} = z_c (W_c \star x + b_c)`, convolving only the open output maps when that pays.

    The closed maps of the output are exact zeros (a tensor of the full shape is returned).
    """
    columns = use_compact(z, mode, CONV_OPEN_FRACTION, num_open) if z.dim() == 1 else None
    if columns is None or not columns.numel():  # (no open map: the output shape is the full path's)
        y = F.conv2d(x, weight, bias, stride, padding, dilation)
        return y * z[..., :, None, None]
    w_open = weight.index_select(0, columns)
    b_open = None if bias is None else bias.index_select(0, columns)
    y_open = F.conv2d(x, w_open, b_open, stride, padding, dilation) * z.index_select(0, columns)[:, None, None]
    shape = list(y_open.shape)
    shape[-3] = weight.shape[0]
    return y_open.new_zeros(shape).index_copy(-3, columns, y_open)
