"""KL divergence between two hard concrete gates (Appendix C, Eq. 27-29)."""

import math

import torch
from torch.distributions.kl import register_kl

from ._stable import log_logistic_density, log_sigmoid
from .hard_concrete import HardConcrete
from .quadrature import _ACCURACY_CONSTANT, MAX_NODES, map_chunks, num_nodes_for

KL_METHODS = ("quadrature", "monte_carlo")


def kl_hard_concrete(q, p, method="quadrature", num_nodes=None, num_samples=1000):
    r"""KL divergence :math:`KL(q \| p)` between two :class:`HardConcrete` gates, Eq. 28.

    Both are mixtures of an atom at 0, an atom at 1 and a density on ``(0, 1)``, whatever their
    temperatures and stretch limits, so by the chain rule of relative entropy

    .. math::
        KL(q\|p) = Q_0 \log\frac{Q_0}{P_0} + Q_1 \log\frac{Q_1}{P_1}
        + \int_0^1 \bar q(z)\,[\log \bar q(z) - \log \bar p(z)]\, dz ,

    with :math:`Q_0, Q_1` (:math:`P_0, P_1`) the atoms of ``q`` (``p``) and :math:`\bar q,
    \bar p` the untruncated stretched-concrete densities.

    :param q: the approximate posterior gate.
    :param p: the prior gate; parameters broadcast against ``q``'s.
    :param str method: ``"quadrature"`` (default): Gauss-Legendre quadrature of the
        continuous part in ``q``'s logit variable: deterministic, differentiable in both
        arguments, accurate to the dtype. ``"monte_carlo"``: Eq. 29, averaging
        ``log q - log p`` over ``num_samples`` draws of :meth:`HardConcrete.sample_continuous`
        (reparameterised, so also differentiable, but noisy).
    :param int num_nodes: quadrature nodes (default: enough for the dtype's accuracy at the
        largest temperature involved, see :func:`l0bayes.distributions.quadrature.num_nodes_for`).
    :param int num_samples: Monte Carlo draws per gate pair.
    :returns: tensor of the broadcast batch shape.
    """
    if not isinstance(q, HardConcrete) or not isinstance(p, HardConcrete):
        raise TypeError(f"kl_hard_concrete expects two HardConcrete, got {type(q).__name__} and {type(p).__name__}")
    if method not in KL_METHODS:
        raise ValueError(f"method must be one of {KL_METHODS}, got {method!r}")
    batch_shape = torch.broadcast_shapes(q.batch_shape, p.batch_shape)
    q, p = q.expand(batch_shape), p.expand(batch_shape)

    if method == "monte_carlo":
        if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
            raise ValueError(f"num_samples must be a positive integer, got {num_samples!r}")
        z = q.sample_continuous((num_samples,))
        log_ratio = q.base.log_prob(z) - p.base.log_prob(z)
        return _kl_atoms(q, p) + q.prob_continuous * log_ratio.mean(0)

    n = q.resolve_num_nodes(num_nodes, p)
    same_stretch = _same_stretch(q, p)
    if num_nodes is None and not same_stretch:
        n = max(n, _num_nodes_cross_stretch(q, p))

    def run(aq, bq, lq, uq, ap, bp, lp, up):
        qc = HardConcrete(aq, bq, lq, uq, validate_args=False)
        pc = HardConcrete(ap, bp, lp, up, validate_args=False)
        return _kl_quadrature(qc, pc, n, same_stretch)

    return map_chunks(run, q._params() + p._params(), batch_shape)


def _kl_atoms(q, p):
    """Q0 log(Q0/P0) + Q1 log(Q1/P1), the logs from logsigmoid."""
    qL0, qL1 = q._logistic_bounds()
    pL0, pL1 = p._logistic_bounds()
    return torch.sigmoid(qL0) * (log_sigmoid(qL0) - log_sigmoid(pL0)) + torch.sigmoid(-qL1) * (
        log_sigmoid(-qL1) - log_sigmoid(-pL1)
    )


def _kl_quadrature(q, p, num_nodes, same_stretch):
    v, w = q.continuous_quadrature(num_nodes)
    if same_stretch:
        # Same (lower, upper): p's logit variable at z(v) is v itself and the Jacobians cancel.
        bq, bp = q.temperature.unsqueeze(-1), p.temperature.unsqueeze(-1)
        aq, ap = q.log_alpha.unsqueeze(-1), p.log_alpha.unsqueeze(-1)
        log_ratio = log_logistic_density(bq * v - aq) - log_logistic_density(bp * v - ap)
        log_temperatures = torch.log(q.temperature) - torch.log(p.temperature)
        continuous = (w * log_ratio).sum(-1) + q.prob_continuous * log_temperatures
    else:
        continuous = (w * (q._continuous_log_density(v) - _stretched_log_density_at(p, q, v))).sum(-1)
    return _kl_atoms(q, p) + continuous


def _same_stretch(q, p):
    return (q.lower is p.lower or torch.equal(q.lower, p.lower)) and (
        q.upper is p.upper or torch.equal(q.upper, p.upper)
    )


def _num_nodes_cross_stretch(q, p):
    r"""Quadrature size for ``log pbar`` on ``q``'s logit grid when the stretches differ.

    In ``q``'s logit variable ``v``, ``log pbar`` has branch points on the real axis where
    ``z(v) = lower_p`` (if ``lower_p > lower_q``) or ``z(v) = upper_p`` (if ``upper_p < upper_q``),
    just outside ``(v0, v1)``, and ``p``'s logit varies up to ``J = max dy_p/dv`` times faster than
    ``v``, which narrows the strip of analyticity to about ``pi / (temperature_p J)``. Both shrink
    the Bernstein ellipse that :func:`~l0bayes.distributions.quadrature.num_nodes_for` assumes.
    """
    with torch.no_grad():
        lq, uq = q.lower.double().reshape(-1), q.upper.double().reshape(-1)
        lp, up = p.lower.double().reshape(-1), p.upper.double().reshape(-1)
        v0, v1 = torch.log(-lq) - torch.log(uq), torch.log1p(-lq) - torch.log(uq - 1.0)
        centre, half = 0.5 * (v0 + v1), 0.5 * (v1 - v0)
        # Jacobian dy_p/dv_q on a grid of z in [0, 1].
        z = torch.linspace(0.0, 1.0, 65, dtype=torch.float64).unsqueeze(-1)
        jac = (up - lp) / (uq - lq) * (z - lq) / (z - lp) * (uq - z) / (up - z)
        effective_temperature = float((p.temperature.double().reshape(-1) * jac.max(0).values).max())
        effective_temperature = max(effective_temperature, float(q.temperature.detach().max()))
        n = num_nodes_for(effective_temperature, float(half.max()), q.log_alpha.dtype)
        # Real branch points of log(z - lower_p), log(upper_p - z), in units of the half-width.
        t_lower = (lp - lq) / (uq - lq)
        t_upper = (up - lq) / (uq - lq)
        x = torch.cat(
            [
                ((centre - (torch.log(t_lower) - torch.log1p(-t_lower))) / half)[t_lower > 0],
                (((torch.log(t_upper) - torch.log1p(-t_upper)) - centre) / half)[t_upper < 1],
            ]
        )
        if x.numel():
            x = float(x.min())
            rho = x + math.sqrt(max(x * x - 1.0, 0.0))
            c = _ACCURACY_CONSTANT.get(q.log_alpha.dtype, _ACCURACY_CONSTANT[torch.float32])
            n = max(n, MAX_NODES if rho <= 1.0 else math.ceil(c / math.log(rho)))
    return int(min(MAX_NODES, n))


def _stretched_log_density_at(p, q, v):
    r""":math:`\log \bar p(z)` at the points :math:`z = z_q(v)` of ``q``'s quadrature grid."""
    lq, uq = q.lower.unsqueeze(-1), q.upper.unsqueeze(-1)
    lp, up = p.lower.unsqueeze(-1), p.upper.unsqueeze(-1)
    # z - lp and up - z as sums of non-negative terms (0 <= z <= 1, lp < 0, up > 1).
    z = (uq - lq) * torch.sigmoid(v) + lq
    z = z.clamp(0.0, 1.0)
    log_left = torch.log(z - lp)
    log_right = torch.log(up - z)
    bp, ap = p.temperature.unsqueeze(-1), p.log_alpha.unsqueeze(-1)
    log_density = torch.log(bp) + log_logistic_density(bp * (log_left - log_right) - ap)
    return log_density - log_left - log_right + torch.log(up - lp)


@register_kl(HardConcrete, HardConcrete)
def _kl_hard_concrete_hard_concrete(q, p):
    return kl_hard_concrete(q, p)
