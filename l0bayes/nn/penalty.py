r"""The deterministic complexity terms of Eq. 9 / Eq. 15-17, summed over a network's L0 layers."""

from numbers import Real

import torch

from .layers import L0Layer


def l0_layers(module):
    """``(name, layer)`` pairs of the :class:`~l0bayes.nn.layers.L0Layer` s in ``module``, in registration order.

    The names are those of :meth:`torch.nn.Module.named_modules` (``""`` when ``module`` itself is
    a layer); they are the keys of the per-layer dictionaries accepted by :func:`penalty`.
    """
    return [(name, m) for name, m in module.named_modules() if isinstance(m, L0Layer)]


def _zero(module):
    p = next(module.parameters(), None)
    return torch.zeros((), dtype=p.dtype, device=p.device) if p is not None else torch.zeros(())


def expected_l0(module):
    r"""Eq. 16 summed over all L0 layers: the expected number of active gated weights of ``module``."""
    total = _zero(module)
    for _, layer in l0_layers(module):
        total = total + layer.expected_l0()
    return total


def expected_l2(module):
    r"""Eq. 17 summed over all L0 layers (see each layer's ``expected_l2`` for its groups)."""
    total = _zero(module)
    for _, layer in l0_layers(module):
        total = total + layer.expected_l2()
    return total


def _per_layer(value, names, what):
    """``{name: float}`` from a number or a dictionary that must name every L0 layer exactly."""
    if isinstance(value, Real):
        if value < 0:
            raise ValueError(f"{what} must be non-negative, got {value!r}")
        return {name: float(value) for name in names}
    if isinstance(value, dict):
        unknown = sorted(set(value) - set(names))
        missing = [n for n in names if n not in value]
        if unknown or missing:
            raise ValueError(
                f"{what} dictionary must name every L0 layer exactly; L0 layers: {names}, "
                f"unknown keys: {unknown}, missing: {missing}"
            )
        out = {name: float(value[name]) for name in names}
        if any(v < 0 for v in out.values()):
            raise ValueError(f"{what} values must be non-negative, got {value!r}")
        return out
    raise TypeError(f"{what} must be a number or a dict {{layer_name: value}}, got {type(value).__name__}")


def penalty(module, lam, weight_decay=0.0):
    r"""The penalised regulariser of Eq. 9 with the L2 term of Eq. 15/17, summed over L0 layers.

    .. math::
        R = \sum_{\ell} \Big(\lambda_\ell\, E[\|\theta_\ell\|_0] + \tfrac{1}{2}\,\mathrm{wd}_\ell\,
        E[\|\hat\theta_\ell\|_2^2]\Big),

    with :math:`E[\|\theta_\ell\|_0]` of Eq. 16 (``layer.expected_l0()``) and
    :math:`E[\|\hat\theta_\ell\|_2^2]` of Eq. 17 (``layer.expected_l2()``). Add ``R`` to the
    *averaged* data loss, so the paper's :math:`\lambda = 0.1/N` means ``lam=0.1 / N``.

    Deterministic and differentiable in the weights and ``log_alpha``. Only L0 layers contribute:
    weight decay on any other (dense) layer is the caller's business.

    :param lam: a float, or a dict ``{layer_name: lambda}`` naming every L0 layer (names from
        :func:`l0_layers`, e.g. ``{"conv1": 10 / N, "conv2": 10 / N, "fc1": 0.5 / N, "fc2": 0.5 / N}``
        for the paper's "lambda sep." LeNet-5).
    :param weight_decay: a float or such a dict.
    """
    layers = l0_layers(module)
    names = [name for name, _ in layers]
    lams = _per_layer(lam, names, "lam")
    wds = _per_layer(weight_decay, names, "weight_decay")
    total = _zero(module)
    for name, layer in layers:
        if lams[name] != 0.0:
            total = total + lams[name] * layer.expected_l0()
        if wds[name] != 0.0:
            total = total + 0.5 * wds[name] * layer.expected_l2()
    return total
