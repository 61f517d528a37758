r"""The tempered KL term of distillation, :math:`T^2\,\mathrm{KL}(\mathrm{softmax}(t/T) \| \mathrm{softmax}(s/T))`,
finite at every temperature.

At a high temperature both distributions are nearly uniform: the KL is of the order of :math:`1/T^2`, so computing it
from the two log-probabilities and then multiplying by :math:`T^2` multiplies their rounding by :math:`T^2` (and at
:math:`T = 10^{30}` gives ``0 * inf``, a NaN). :func:`tempered_kl_divergence` computes it from the logit differences
instead: with :math:`d = t - s`, :math:`u = d/T - \Delta` and :math:`\Delta = \log \sum_i p_{s,i}\, e^{d_i/T}` (so that
:math:`p_t = p_s e^{u}`),

.. math::

    T^2\,\mathrm{KL} = \sum_i p_{s,i}\, v_i^2\, \psi(u_i), \qquad v = T u = d - T\Delta,
    \qquad \psi(u) = \frac{1 + (u - 1)e^u}{u^2} = \sum_{k \ge 2} \frac{k - 1}{k!}\, u^{k-2},

where nothing is multiplied by :math:`T` or :math:`T^2` (:math:`T\Delta` comes from :math:`\sum_i p_{s,i} d_i
\frac{e^{d_i/T} - 1}{d_i/T}` without forming :math:`e^\Delta - 1` first). As :math:`T \to \infty` it tends to
:math:`\frac{1}{2C}\sum_i (d_i - \bar d)^2` over :math:`C` classes, Hinton et al.'s logit matching.
"""

import math

import torch
import torch.nn.functional as F

__all__ = ["tempered_kl_divergence"]

#: ``(k - 1) / k!`` for ``k = 2, ..., 12``: the series of ``psi`` (the first term left out is below 1e-19 for
#: ``|u| < 0.1``).
_PSI = [(k - 1) / math.factorial(k) for k in range(2, 13)]
#: Below this ``|u|`` ``psi`` is its series; above, its closed form, whose cancellation costs about ``20`` roundings.
_SERIES = 0.1


def tempered_kl_divergence(student_logits, teacher_logits, temperature):
    r""":math:`T^2\,\mathrm{KL}(\mathrm{softmax}(t/T) \| \mathrm{softmax}(s/T))` over the last dimension, one value per
    row, finite for any temperature :math:`T > 0` (module docstring).

    A row whose logit differences stay within :math:`T` (``|t - s| <= T`` wherever both are finite, always the case at
    a high temperature) takes the computation from the differences; any other row, the one from the two
    log-probabilities (where the KL is not small, and that one is accurate). A class ruled out by both (``-inf``)
    adds nothing; a row where only one of them rules a class out takes the log-probabilities too.
    """
    t = float(temperature)
    s, te = student_logits, teacher_logits
    s_out, t_out = torch.isneginf(s), torch.isneginf(te)
    d = torch.where(s_out | t_out, 0.0, te - s)
    regular = ~(s_out ^ t_out).any(-1, keepdim=True) & ((d / t).abs() <= 1).all(-1, keepdim=True)
    p_s = F.log_softmax(s / t, dim=-1).exp()
    d = torch.where(regular, d, 0.0)  # the other rows: zeros, which keep every step below finite (and its gradient)
    v = d - _scaled_delta(p_s, d, t)  # T u
    stable = (p_s * v.square() * _psi(v / t)).sum(-1)
    # The other rows from the log-probabilities, with T^2 as a tensor that is 0 on the regular rows (no 0 * inf)
    regular = regular.squeeze(-1)
    naive = _kl(torch.where(regular[..., None], 0.0, s) / t, torch.where(regular[..., None], 0.0, te) / t)
    scale = torch.where(regular, 0.0, torch.full_like(naive, min(t, torch.finfo(naive.dtype).max)).square())
    return torch.where(regular, stable, naive * scale)


def _scaled_delta(p_s, d, t):
    r""":math:`T\Delta = T \log\big(1 + \sum_i p_{s,i} (e^{d_i/T} - 1)\big)` for :math:`|d_i/T| \le 1`, from
    :math:`w = \sum_i p_{s,i}\, d_i\, \mathrm{exprel}(d_i/T)` as :math:`w \log(1 + w/T) / (w/T)`."""
    w = (p_s * d * _exprel(d / t)).sum(-1, keepdim=True)
    x = w / t
    small = x.abs() < 1e-4
    xs = torch.where(small, 1.0, x)
    return w * torch.where(small, 1 - x / 2 + x.square() / 3, torch.log1p(xs) / xs)


def _exprel(z):
    """``(e^z - 1) / z`` (1 at 0)."""
    small = z.abs() < 1e-4
    zs = torch.where(small, 1.0, z)
    return torch.where(small, 1 + z / 2 + z.square() / 6, torch.expm1(zs) / zs)


def _psi(u):
    r""":math:`\psi(u) = (1 + (u - 1) e^u) / u^2`: its series below :data:`_SERIES`, else
    :math:`(u\,(e^u - 1) - (e^u - 1 - u)) / u^2`."""
    small = u.abs() < _SERIES
    us = torch.where(small, u, 0.0)
    series = torch.full_like(u, _PSI[-1])
    for c in reversed(_PSI[:-1]):
        series = series * us + c
    ul = torch.where(small, 1.0, u)
    e = torch.expm1(ul)
    return torch.where(small, series, (ul * e - (e - ul)) / ul.square())


def _kl(student_logits, teacher_logits):
    """``KL(softmax(teacher) || softmax(student))`` per row from the log-probabilities (0 where ``p_t = 0``)."""
    log_p_s = F.log_softmax(student_logits, dim=-1)
    log_p_t = F.log_softmax(teacher_logits, dim=-1)
    p_t = log_p_t.exp()
    return torch.where(p_t > 0, p_t * (log_p_t - log_p_s), 0.0).sum(-1)
