"""Numerically stable scalar building blocks shared by the hard concrete code.

Everything here is elementwise, differentiable and free of ad-hoc ``eps`` fudges:
each function is an exact rewrite of its naive form that avoids overflow and
cancellation (see docs/mathematics.md, "The stretched variable").
"""

import torch
import torch.nn.functional as F


def softplus(x):
    r""":math:`\log(1 + e^x)`; above the cut-over ``x = 40`` it returns ``x`` (error below :math:`e^{-40}`)."""
    return F.softplus(x, beta=1.0, threshold=40.0)


def log_sigmoid(x):
    r""":math:`\log\sigma(x) = -\mathrm{softplus}(-x)`.

    Used instead of ``torch.nn.functional.logsigmoid``, whose CPU kernel (torch 2.13) takes
    milliseconds even on tiny tensors when the other cores are busy.
    """
    return -softplus(-x)


def log_logistic_density(x):
    r"""Log density of the standard logistic distribution, :math:`\log \sigma(x)\sigma(-x)`.

    Written as ``-|x| - 2 softplus(-|x|)``, which never overflows and keeps full relative
    accuracy in the tails.
    """
    ax = x.abs()
    return -ax - 2.0 * softplus(-ax)


def sigmoid_difference(hi, lo):
    r""":math:`\sigma(hi) - \sigma(lo)` for ``hi >= lo`` without cancellation.

    Uses :math:`\sigma(hi)\,\sigma(-lo)\,(1 - e^{lo - hi})`, which keeps full relative
    accuracy when both sigmoids are close to 0 or to 1 (docs/mathematics.md, "The stretched variable").
    """
    return torch.sigmoid(hi) * torch.sigmoid(-lo) * -torch.expm1(lo - hi)


def log_sigmoid_difference(hi, lo):
    r""":math:`\log(\sigma(hi) - \sigma(lo))` for ``hi > lo``, stable in both tails."""
    return log_sigmoid(hi) + log_sigmoid(-lo) + log1mexp(hi - lo)


def log1mexp(x):
    r""":math:`\log(1 - e^{-x})` for ``x > 0`` (Maechler's switch at :math:`\log 2`)."""
    small = x < 0.6931471805599453
    # Evaluate each branch on a safe argument so that the unused one cannot produce
    # inf/nan gradients through torch.where.
    x_small = torch.where(small, x, torch.ones_like(x))
    x_large = torch.where(small, torch.ones_like(x), x)
    return torch.where(small, torch.log(-torch.expm1(-x_small)), torch.log1p(-torch.exp(-x_large)))
