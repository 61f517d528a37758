"""The binary concrete distribution stretched to ``(lower, upper)`` (paper Eq. 10, 23-25)."""

from numbers import Number

import torch
from pyro.distributions import TorchDistribution, constraints
from torch.distributions.utils import broadcast_all

from ._stable import log_logistic_density


def stretch_logit_bounds(lower, upper):
    r"""The logit-scale interval ``(v0, v1)`` that the stretch maps onto ``(0, 1)``.

    With :math:`t(x) = (x - l)/(u - l)`, :math:`v_0 = \mathrm{logit}\,t(0) = \log(-l/u)` and
    :math:`v_1 = \mathrm{logit}\,t(1) = \log((1 - l)/(u - 1))`.
    """
    v0 = torch.log(-lower) - torch.log(upper)
    v1 = torch.log1p(-lower) - torch.log(upper - 1.0)
    return v0, v1


def standard_logistic(shape, dtype, device):
    """Standard logistic noise ``log U - log(1 - U)`` with ``U`` kept off 0 and 1."""
    finfo = torch.finfo(dtype)
    u = torch.rand(shape, dtype=dtype, device=device).clamp_(min=finfo.tiny, max=1.0 - finfo.eps)
    return torch.logit_(u)


def stretched_concrete_rsample(shape, log_alpha, temperature, lower, upper):
    r"""A reparameterised draw of Eq. 10, :math:`\gamma + (\zeta - \gamma)\,\sigma((L + \log\alpha)/\beta)`.

    ``shape`` is the sample shape including ``log_alpha``'s; ``temperature``, ``lower`` and ``upper``
    may be tensors broadcasting against it or plain floats (the hot path of the gated layers).
    """
    noise = standard_logistic(shape, log_alpha.dtype, log_alpha.device)
    if isinstance(temperature, Number):  # the hot path: one differentiable operation before the sigmoid
        s = torch.sigmoid(torch.add(noise.div_(temperature), log_alpha, alpha=1.0 / temperature))
    else:
        s = torch.sigmoid((noise + log_alpha) / temperature)
    return s * (upper - lower) + lower


class _Finite(constraints.Constraint):
    """``base`` and finite: ``validate_args`` then rejects an infinite temperature or stretch."""

    def __init__(self, base):
        self.base = base
        super().__init__()

    def check(self, value):
        return self.base.check(value) & torch.isfinite(value)

    def __repr__(self):
        return f"Finite({self.base!r})"


class ConcreteParameters(TorchDistribution):
    """Parameters ``(log_alpha, temperature, lower, upper)`` shared by the concrete distributions.

    Broadcasts them like PyTorch, declares their constraints for ``validate_args``, and overrides
    ``expand`` the way Pyro's own distributions do, so an expanded distribution keeps its type
    (and the registered KL still applies).
    """

    # The table of argument checks, applied by torch.distributions when ``validate_args`` is on.
    arg_constraints = {
        "log_alpha": constraints.real,
        "temperature": _Finite(constraints.positive),
        "lower": _Finite(constraints.less_than(0.0)),
        "upper": _Finite(constraints.greater_than(1.0)),
    }
    has_rsample = True

    def __init__(self, log_alpha, temperature=2.0 / 3.0, lower=-0.1, upper=1.1, validate_args=None):
        _check_floating(type(self).__name__, log_alpha=log_alpha, temperature=temperature, lower=lower, upper=upper)
        self.log_alpha, self.temperature, self.lower, self.upper = broadcast_all(log_alpha, temperature, lower, upper)
        if all(isinstance(p, Number) for p in (log_alpha, temperature, lower, upper)):
            batch_shape = torch.Size()
        else:
            batch_shape = self.log_alpha.shape
        super().__init__(batch_shape, validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(type(self), _instance)
        batch_shape = torch.Size(batch_shape)
        for name in ("log_alpha", "temperature", "lower", "upper"):
            setattr(new, name, getattr(self, name).expand(batch_shape))
        super(ConcreteParameters, new).__init__(batch_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new


class StretchedConcrete(ConcreteParameters):
    r"""A binary concrete variable stretched to ``(lower, upper)``: the :math:`\bar s` of Eq. 10.

    .. math::
        L \sim \mathrm{Logistic}(0, 1), \quad s = \sigma\big((L + \log\alpha)/\beta\big),
        \quad \bar s = \gamma + (\zeta - \gamma)\, s .

    Its CDF is Eq. 24-25, :math:`\bar Q(x) = \sigma(\beta\, y(x) - \log\alpha)` with
    :math:`y(x) = \log(x - \gamma) - \log(\zeta - x)`, and its log density (Eq. 23, 25) is
    evaluated as

    .. math::
        \log \bar q(x) = \log\beta + \log f(\beta y - \log\alpha) - \log(x - \gamma)
        - \log(\zeta - x) + \log(\zeta - \gamma),

    with :math:`f` the standard logistic density, a form that cannot overflow for small
    temperatures (docs/mathematics.md, "The stretched variable"). Rectifying it with a hard sigmoid gives
    :class:`~l0bayes.distributions.HardConcrete`.

    :param log_alpha: location :math:`\log\alpha` (any real tensor or float).
    :param temperature: :math:`\beta > 0`.
    :param lower: :math:`\gamma < 0`.
    :param upper: :math:`\zeta > 1`.
    """

    @constraints.dependent_property(is_discrete=False, event_dim=0)
    def support(self):
        return constraints.interval(self.lower, self.upper)

    def rsample(self, sample_shape=torch.Size()):
        """Reparameterised sample of Eq. 10 (before the hard sigmoid of Eq. 11)."""
        shape = self._extended_shape(sample_shape)
        return stretched_concrete_rsample(shape, self.log_alpha, self.temperature, self.lower, self.upper)

    def log_prob(self, value):
        """Log density of Eq. 23/25 in the overflow-free form; ``-inf`` outside ``(lower, upper)``."""
        if self._validate_args:
            self._validate_sample(value)
        value, lower, upper = broadcast_all(value, self.lower, self.upper)
        inside = (value > lower) & (value < upper)
        safe = torch.where(inside, value, 0.5 * (lower + upper))
        log_left, log_right = torch.log(safe - lower), torch.log(upper - safe)
        y = log_left - log_right
        log_density = (
            torch.log(self.temperature)
            + log_logistic_density(self.temperature * y - self.log_alpha)
            - log_left
            - log_right
            + torch.log(upper - lower)
        )
        out = torch.where(inside, log_density, torch.full_like(log_density, -float("inf")))
        return torch.where(torch.isnan(value), value, out)  # NaN in, NaN out (with validate_args off)

    def cdf(self, value):
        """Eq. 24-25: :math:`\\sigma(\\beta y(x) - \\log\\alpha)`, 0 below ``lower``, 1 above ``upper``; NaN at NaN."""
        if self._validate_args:
            check_not_nan(value)
        value, lower, upper = broadcast_all(value, self.lower, self.upper)
        inside = (value > lower) & (value < upper)
        safe = torch.where(inside, value, 0.5 * (lower + upper))
        y = torch.log(safe - lower) - torch.log(upper - safe)
        inner = torch.sigmoid(self.temperature * y - self.log_alpha)
        out = torch.where(inside, inner, (value >= upper).to(inner.dtype))
        return torch.where(torch.isnan(value), value, out)

    def icdf(self, value):
        r"""Quantile function, :math:`\gamma + (\zeta - \gamma)\,\sigma((\mathrm{logit}\,p + \log\alpha)/\beta)`."""
        if self._validate_args:
            _check_probability(value)
        logit_p = torch.log(value) - torch.log1p(-value)
        s = torch.sigmoid((logit_p + self.log_alpha) / self.temperature)
        return self.lower + (self.upper - self.lower) * s

    @property
    def mean(self):
        raise NotImplementedError("StretchedConcrete has no closed-form mean; see HardConcrete.mean")

    @property
    def variance(self):
        raise NotImplementedError("StretchedConcrete has no closed-form variance")


def _check_floating(owner, **params):
    """A tensor parameter must be floating point: an integer ``log_alpha`` would turn the others into integers."""
    for name, value in params.items():
        if torch.is_tensor(value) and not value.is_floating_point():
            raise TypeError(f"{owner}: {name} must be a floating-point tensor or a float, got a {value.dtype} tensor")


def check_not_nan(value):
    """``cdf``'s argument check: any real value (outside the support too) but not NaN."""
    if torch.isnan(torch.as_tensor(value)).any():
        raise ValueError("cdf: value must not be NaN")


def _check_probability(value):
    value = torch.as_tensor(value)
    if not torch.all((value >= 0) & (value <= 1)):
        raise ValueError("icdf: value must be a probability in [0, 1] (NaN is not)")
