"""The hard concrete distribution of Louizos, Welling & Kingma (2018), Eq. 10-13, 26."""

import math

import torch
from pyro.distributions import constraints

from ._stable import log_logistic_density, log_sigmoid, sigmoid_difference, softplus
from .quadrature import check_num_nodes, gauss_legendre, map_chunks, num_nodes_for
from .stretched_concrete import (
    ConcreteParameters,
    StretchedConcrete,
    _check_probability,
    check_not_nan,
    stretch_logit_bounds,
)


class HardConcrete(ConcreteParameters):
    r"""Hard concrete gate: a stretched binary concrete rectified to ``[0, 1]`` (Eq. 10-11).

    .. math::
        \begin{gathered}
        u \sim \mathcal U(0, 1),\quad
        s = \sigma\!\left(\frac{\log u - \log(1 - u) + \log\alpha}{\beta}\right),\\
        \bar s = s(\zeta - \gamma) + \gamma,\quad z = \min(1, \max(0, \bar s)).
        \end{gathered}

    The law of ``z`` is the mixture of Eq. 26: an atom :math:`\bar Q(0)` at 0, an atom
    :math:`1 - \bar Q(1)` at 1, and the density :math:`\bar q` of
    :class:`StretchedConcrete` on ``(0, 1)``. :meth:`log_prob` is the log density with respect
    to :math:`\delta_0 + \delta_1 + \text{Lebesgue}` on ``(0, 1)``.

    Moments and entropy are exact up to Gauss-Legendre quadrature of the continuous part in
    the logit variable :math:`v = \mathrm{logit}((z - \gamma)/(\zeta - \gamma))`, which lives on
    the fixed interval :math:`(\log(-\gamma/\zeta), \log((1 - \gamma)/(\zeta - 1)))` (docs/mathematics.md,
    "Deterministic quadrature"); they are deterministic and differentiable.

    :param log_alpha: location :math:`\log\alpha`; any real tensor or float.
    :param temperature: :math:`\beta > 0` (the paper uses 2/3).
    :param lower: stretch :math:`\gamma < 0` (the paper uses -0.1).
    :param upper: stretch :math:`\zeta > 1` (the paper uses 1.1).
    :param validate_args: as in :class:`torch.distributions.Distribution`.

    Example::

        >>> d = HardConcrete(torch.zeros(3))
        >>> z = d.rsample()                 # in [0, 1], exact zeros with probability d.prob_zero
        >>> d.prob_nonzero                  # Eq. 12, the expected L0 norm of each gate
        tensor([0.8318, 0.8318, 0.8318])
    """

    support = constraints.unit_interval

    # ------------------------------------------------------------------ building blocks
    @property
    def base(self):
        """The :class:`StretchedConcrete` :math:`\\bar s` that is rectified to give this gate."""
        return StretchedConcrete(self.log_alpha, self.temperature, self.lower, self.upper, validate_args=False)

    def _logit_bounds(self):
        """The interval ``(v0, v1)`` of the logit variable that maps onto ``(0, 1)``."""
        return stretch_logit_bounds(self.lower, self.upper)

    def _logistic_bounds(self, log_alpha=None):
        r"""``(L0, L1)``: the standard-logistic noise values at which :math:`\bar s` hits 0 and 1."""
        log_alpha = self.log_alpha if log_alpha is None else log_alpha
        v0, v1 = self._logit_bounds()
        return self.temperature * v0 - log_alpha, self.temperature * v1 - log_alpha

    def _finite_log_alpha(self):
        r"""``log_alpha`` with :math:`\pm\infty` replaced by a finite value with the same gate in floating point.

        At :math:`\log\alpha = \pm\infty` the gate is the point mass at 1 (or 0), and the continuous
        part has no mass: its expectations are ``0 * log 0`` forms. Beyond
        :math:`|\log\alpha| = \beta\max(|v_0|, |v_1|) + 1000` every atom and quadrature weight is
        exactly 0 or 1 in float32 and float64 (:math:`e^{-1000}` underflows), so evaluating there gives
        the limits exactly: entropy 0, ``prob_continuous`` 0, the KL of a point mass. The continuous
        part's conditional law also has a limit (an exponentially tilted law in the logit variable),
        which :meth:`sample_continuous` draws from this finite value. NaN stays NaN.
        """
        a = self.log_alpha
        v0, v1 = self._logit_bounds()
        far = self.temperature * torch.maximum(v0.abs(), v1.abs()) + 1000.0
        return torch.where(torch.isinf(a), torch.copysign(far.expand_as(a).detach(), a), a)

    # ------------------------------------------------------------------ atoms (Eq. 12, 26)
    @property
    def prob_zero(self):
        r""":math:`P(z = 0) = \bar Q(0) = \sigma(\beta \log(-\gamma/\zeta) - \log\alpha)`."""
        return torch.sigmoid(self._logistic_bounds()[0])

    @property
    def prob_one(self):
        r""":math:`P(z = 1) = 1 - \bar Q(1) = \sigma(\log\alpha - \beta\log((1 - \gamma)/(\zeta - 1)))`."""
        return torch.sigmoid(-self._logistic_bounds()[1])

    @property
    def prob_nonzero(self):
        r"""Eq. 12: :math:`P(z \neq 0) = \sigma(\log\alpha - \beta \log(-\gamma/\zeta))`, the expected L0 norm."""
        return torch.sigmoid(-self._logistic_bounds()[0])

    @property
    def prob_continuous(self):
        r""":math:`P(0 < z < 1) = \bar Q(1) - \bar Q(0)`, computed without cancellation.

        0 at :math:`\log\alpha = \pm\infty`.
        """
        L0, L1 = self._logistic_bounds(self._finite_log_alpha())
        return sigmoid_difference(L1, L0)

    # ------------------------------------------------------------------ density, cdf
    def log_prob(self, value):
        r"""Log density of Eq. 26 w.r.t. :math:`\delta_0 + \delta_1 + \text{Lebesgue}`.

        :math:`\log \bar Q(0)` at exactly 0, :math:`\log(1 - \bar Q(1))` at exactly 1,
        :math:`\log \bar q(z)` inside and ``-inf`` outside ``[0, 1]``.
        """
        if self._validate_args:
            self._validate_sample(value)
        value = torch.as_tensor(value, dtype=self.log_alpha.dtype, device=self.log_alpha.device)
        scalars = _scalar_values(self.temperature, self.lower, self.upper)
        if scalars is not None:
            return _log_prob_scalar_parameters(value, self.log_alpha, *scalars)
        L0, L1 = self._logistic_bounds()
        log_p0 = log_sigmoid(L0)
        log_p1 = log_sigmoid(-L1)
        inside = (value > 0) & (value < 1)
        safe = torch.where(inside, value, torch.full_like(value, 0.5))
        log_inside = self.base.log_prob(safe)
        out = torch.where(inside, log_inside, torch.full_like(log_inside, -float("inf")))
        out = torch.where(value == 0, log_p0, out)
        out = torch.where(value == 1, log_p1, out)
        return torch.where(torch.isnan(value), value, out)  # NaN in, NaN out (with validate_args off)

    def cdf(self, value):
        r"""CDF of Eq. 26: 0 below 0, :math:`\bar Q(z)` on ``[0, 1)`` (so :math:`\bar Q(0)` at 0), 1 from 1 on.

        NaN gives NaN, or a :class:`ValueError` when ``validate_args`` is on.
        """
        if self._validate_args:
            check_not_nan(value)
        value = torch.as_tensor(value, dtype=self.log_alpha.dtype, device=self.log_alpha.device)
        inside = (value >= 0) & (value < 1)
        safe = torch.where(inside, value, torch.full_like(value, 0.5))
        inner = self.base.cdf(safe)
        out = torch.where(inside, inner, (value >= 1).to(inner.dtype))
        return torch.where(torch.isnan(value), value, out)

    def icdf(self, value):
        r"""Generalised inverse :math:`\inf\{z : F(z) \ge p\}` of :meth:`cdf`.

        0 for :math:`p \le \bar Q(0)`, 1 for :math:`p \ge \bar Q(1)`, else
        :math:`\gamma + (\zeta - \gamma)\sigma((\mathrm{logit}\,p + \log\alpha)/\beta)`.
        """
        if self._validate_args:
            _check_probability(value)
        value = torch.as_tensor(value, dtype=self.log_alpha.dtype, device=self.log_alpha.device)
        L0, L1 = self._logistic_bounds()
        # Compare on the logit scale: exact in the tails where probabilities round to 0 or 1.
        logit_p = torch.log(value) - torch.log1p(-value)
        z = self.lower + (self.upper - self.lower) * torch.sigmoid((logit_p + self.log_alpha) / self.temperature)
        z = torch.where(logit_p <= L0, torch.zeros_like(z), z)
        return torch.where(logit_p >= L1, torch.ones_like(z), z)

    # ------------------------------------------------------------------ sampling
    def rsample(self, sample_shape=torch.Size()):
        """Reparameterised sample of Eq. 10-11 (gradients pass where ``0 < z < 1``)."""
        return self.base.rsample(sample_shape).clamp(0.0, 1.0)

    def sample_continuous(self, sample_shape=torch.Size()):
        r"""Reparameterised sample of the continuous part, :math:`\bar s` truncated to ``(0, 1)``.

        Eq. 29 with the corrected interval: :math:`z = \bar Q^{-1}(\bar Q(0) + u(\bar Q(1) - \bar Q(0)))`
        (the paper's ``(gamma, zeta)`` would give the untruncated :math:`\bar s`). The inversion is
        done on the logistic scale, measured from the end of ``(L0, L1)`` nearer to zero so
        that no probability rounds to 0 or 1 and nothing cancels, in float32 too
        (docs/mathematics.md, "Monte Carlo with the corrected interval").
        """
        shape = self._extended_shape(sample_shape)
        dtype, device = self.log_alpha.dtype, self.log_alpha.device
        u = torch.rand(shape, dtype=dtype, device=device)  # exact in [0, 1); so is 1 - u
        L0, L1 = self._logistic_bounds(self._finite_log_alpha())
        v0, v1 = self._logit_bounds()
        # Invert from the end nearer zero; the upper end is the mirror image L -> -L, u -> 1 - u.
        from_lower = (L0 + L1) >= 0
        near = torch.where(from_lower, L0, -L1)
        far = torch.where(from_lower, L1, -L0)
        u = torch.where(from_lower, u, 1.0 - u)
        distance = _truncated_logistic_offset(near, far, u)
        v = torch.where(from_lower, v0 + distance / self.temperature, v1 - distance / self.temperature)
        v = torch.minimum(torch.maximum(v, v0), v1)
        return torch.addcmul(self.lower, self.upper - self.lower, torch.sigmoid(v)).clamp(0.0, 1.0)

    # ------------------------------------------------------------------ exact expectations
    def _params(self):
        """The parameters for the quadrature of expectations, ``log_alpha`` finite (:meth:`_finite_log_alpha`)."""
        return (self._finite_log_alpha(), self.temperature, self.lower, self.upper)

    def resolve_num_nodes(self, num_nodes=None, *others):
        """Quadrature size: ``num_nodes`` if given, else enough for this gate (and ``others``).

        See :func:`l0bayes.distributions.quadrature.num_nodes_for`.
        """
        if num_nodes is not None:
            check_num_nodes(num_nodes)
            return num_nodes
        dists = (self,) + others
        max_temperature = max(float(d.temperature.detach().max()) for d in dists) if self.batch_shape.numel() else 1.0
        v0, v1 = self._logit_bounds()
        max_half_width = float(0.5 * (v1 - v0).detach().max()) if v0.numel() else 2.4
        return num_nodes_for(max_temperature, max_half_width, self.log_alpha.dtype)

    def _map_chunks(self, fn, num_nodes):
        """Evaluate ``fn(gate_chunk, num_nodes)`` over flat chunks of the batch (bounded memory)."""
        n = self.resolve_num_nodes(num_nodes)

        def run(*params):
            return fn(HardConcrete(*params, validate_args=False), n)

        return map_chunks(run, self._params(), self.batch_shape)

    def continuous_quadrature(self, num_nodes=None):
        r"""Nodes and weights for integrals over the continuous part of the gate.

        Returns ``(v, w)``, both of shape ``batch_shape + (num_nodes,)``, such that
        :math:`\int_0^1 \bar q(z) g(z)\, dz \approx \sum_k w_k\, g(z(v_k))` with
        :math:`z(v) = \gamma + (\zeta - \gamma)\sigma(v)`: Gauss-Legendre in ``v`` on
        ``(v0, v1)``, where :math:`\bar q(z)\,dz = \beta f(\beta v - \log\alpha)\, dv` and
        :math:`f` is the standard logistic density.
        """
        dtype, device = self.log_alpha.dtype, self.log_alpha.device
        nodes, weights = gauss_legendre(self.resolve_num_nodes(num_nodes), dtype, device)
        v0, v1 = (b.unsqueeze(-1) for b in self._logit_bounds())
        half = 0.5 * (v1 - v0)
        v = torch.addcmul(0.5 * (v0 + v1), half, nodes)
        b = self.temperature.unsqueeze(-1)
        log_w = torch.log(b * half) + log_logistic_density(b * v - self.log_alpha.unsqueeze(-1))
        return v, weights * torch.exp(log_w)

    def _z_and_one_minus_z(self, v):
        """``z(v)`` and ``1 - z(v)`` on the quadrature grid, each without cancellation."""
        v0, v1 = (b.unsqueeze(-1) for b in self._logit_bounds())
        scale = (self.upper - self.lower).unsqueeze(-1)
        return scale * sigmoid_difference(v, v0), scale * sigmoid_difference(v1, v)

    def _moments(self, num_nodes, with_variance=True):
        """``(mean, 1 - mean, variance)``, each by its own sum of non-negative terms."""
        v, w = self.continuous_quadrature(num_nodes)
        z, one_minus_z = self._z_and_one_minus_z(v)
        p0, p1 = self.prob_zero, self.prob_one
        mean = p1 + (w * z).sum(-1)
        complement = p0 + (w * one_minus_z).sum(-1)
        if not with_variance:
            return mean, complement, None
        m, cm = mean.unsqueeze(-1), complement.unsqueeze(-1)
        centred = torch.where(m <= 0.5, z - m, cm - one_minus_z)
        variance = p0 * mean**2 + p1 * complement**2 + (w * centred**2).sum(-1)
        return mean, complement, variance

    def moments(self, num_nodes=None):
        r"""Mean, ``1 - mean`` and variance of the gate in one quadrature pass.

        :math:`E[z] = P_1 + \int_0^1 z\,\bar q`, :math:`1 - E[z] = P_0 + \int_0^1 (1 - z)\,\bar q`
        and :math:`\mathrm{Var}[z] = P_0 m^2 + P_1 (1 - m)^2 + \int_0^1 (z - m)^2 \bar q`: sums of
        non-negative terms, so each keeps full relative accuracy even when the gate is almost
        surely 0 or 1 (where ``1 - mean`` by subtraction would cancel).
        """
        return tuple(self._map_chunks(lambda d, n, i=i: d._moments(n)[i], num_nodes) for i in range(3))

    @property
    def mean(self):
        r""":math:`E[z] = P(z = 1) + \int_0^1 z\,\bar q(z)\,dz` (quadrature, differentiable)."""
        return self._map_chunks(lambda d, n: d._moments(n, with_variance=False)[0], None)

    @property
    def variance(self):
        r""":math:`\mathrm{Var}[z]` by quadrature, accurate even for nearly deterministic gates.

        See :meth:`moments`.
        """
        return self._map_chunks(lambda d, n: d._moments(n)[2], None)

    def entropy(self, num_nodes=None):
        r"""Entropy w.r.t. the base measure of :meth:`log_prob`.

        :math:`H = -P_0\log P_0 - P_1 \log P_1 - \int_0^1 \bar q \log \bar q\,dz`, the
        integral by quadrature; 0 at :math:`\log\alpha = \pm\infty` (docs/mathematics.md, "The
        limits").
        """
        return self._map_chunks(lambda d, n: d._entropy(n), num_nodes)

    def _entropy(self, num_nodes):
        L0, L1 = self._logistic_bounds()
        v, w = self.continuous_quadrature(num_nodes)
        atoms = -(torch.sigmoid(L0) * log_sigmoid(L0) + torch.sigmoid(-L1) * log_sigmoid(-L1))
        return atoms - (w * self._continuous_log_density(v)).sum(-1)

    def _continuous_log_density(self, v):
        r""":math:`\log \bar q(z(v))` on the quadrature grid, from ``v`` directly."""
        b = self.temperature.unsqueeze(-1)
        return (
            torch.log(b)
            + log_logistic_density(b * v - self.log_alpha.unsqueeze(-1))
            - log_sigmoid(v)
            - log_sigmoid(-v)
            - torch.log(self.upper - self.lower).unsqueeze(-1)
        )

    @property
    def deterministic_gate(self):
        r"""Eq. 13, the paper's test-time gate.

        :math:`\hat z = \min(1, \max(0, \sigma(\log\alpha)(\zeta - \gamma) + \gamma))`.
        """
        return torch.addcmul(self.lower, self.upper - self.lower, torch.sigmoid(self.log_alpha)).clamp(0.0, 1.0)

    @property
    def median(self):
        """``icdf(0.5)``."""
        return self.icdf(torch.full_like(self.log_alpha, 0.5))


def _scalar_values(*tensors):
    """Plain floats for tensors that hold one value (or expand one value), else ``None``."""
    values = []
    for t in tensors:
        if t.requires_grad or not (t.numel() == 1 or all(st == 0 for st in t.stride())):
            return None
        values.append(float(t.reshape(-1)[0]) if t.numel() else None)
    return None if None in values else values


def _log_prob_scalar_parameters(value, log_alpha, temperature, lower, upper):
    r""":meth:`HardConcrete.log_prob` when ``temperature``, ``lower`` and ``upper`` are single numbers.

    The same formula (Eq. 23, 25, 26) with each ``n``-sized temporary released as soon as the next
    one is made, and the atoms evaluated only at the values that are exactly 0 or 1: about four
    ``n``-sized tensors at the peak instead of fifteen.
    """
    shape = torch.broadcast_shapes(value.shape, log_alpha.shape)
    inside = (value > 0) & (value < 1)
    safe = torch.where(inside, value, 0.5)
    log_left = torch.log(safe - lower)
    log_right = torch.log(upper - safe)
    del safe
    x = torch.abs((log_left - log_right) * temperature - log_alpha)
    log_jacobian = log_left + log_right
    del log_left, log_right
    # log f(x) = -|x| - 2 softplus(-|x|), softplus(-|x|) = log1p(exp(-|x|)) without overflow
    log_density = (x + 2.0 * torch.log1p(torch.exp(-x))).add(log_jacobian).neg()
    del x, log_jacobian
    out = (log_density + (math.log(temperature) + math.log(upper - lower))).expand(shape)
    out = torch.where(inside, out, -math.inf)
    v0 = math.log(-lower) - math.log(upper)
    v1 = math.log1p(-lower) - math.log(upper - 1.0)
    flat = out.view(-1)  # ``out`` is a fresh contiguous tensor; a flat view also covers 0-dim shapes
    for atom, logistic_bound in ((0.0, temperature * v0), (1.0, temperature * v1)):
        at_atom = (value == atom).expand(shape)
        if bool(at_atom.any()):
            a = log_alpha.expand(shape)[at_atom]
            # log P(z = 0) = log sigmoid(L0), log P(z = 1) = log sigmoid(-L1), with L = bound - log_alpha
            flat.index_put_(
                (at_atom.reshape(-1),),
                log_sigmoid(logistic_bound - a) if atom == 0.0 else log_sigmoid(a - logistic_bound),
            )
    return torch.where(torch.isnan(value), value, out)  # NaN in, NaN out (with validate_args off)


def _truncated_logistic_offset(near, far, u):
    r"""``L - near`` for ``L`` standard logistic truncated to ``(near, far)`` at quantile ``u``.

    Solves :math:`F(L) = F(n) + u M`, :math:`M = F(f) - F(n)`, as
    :math:`L - n = \mathrm{softplus}(-n) + \log(F(n) + uM) - \log r` with
    :math:`r = S(L)/S(n) = \sigma(-f) + \sigma(f)e^{-(f-n)} + c(1 - u)`,
    :math:`c = \sigma(f)(1 - e^{-(f-n)})`: every sum has non-negative terms, so nothing
    cancels when both bounds are deep in a tail (used with ``near + far >= 0``).
    """
    width = far - near
    mass = sigmoid_difference(far, near)
    c = torch.sigmoid(far) * -torch.expm1(-width)
    r = torch.sigmoid(-far) + torch.sigmoid(far) * torch.exp(-width) + c * (1.0 - u)
    return softplus(-near) + torch.log(torch.sigmoid(near) + mass * u) - torch.log(r)
