"""KL divergence between two hard concrete gates (Appendix C, Eq. 27-29)."""

import math

import torch
from torch.distributions.kl import register_kl

from ..threads import policy_for
from ._stable import log_logistic_density, log_sigmoid, sigmoid_difference
from .hard_concrete import HardConcrete
from .quadrature import (
    _ACCURACY_CONSTANT,
    CHUNK_SIZE,
    MAX_NODES,
    _legendre_numpy,
    check_num_nodes,
    map_chunks,
    num_nodes_for,
)

KL_METHODS = ("quadrature", "monte_carlo")
# Quadrature nodes per gate pair at the least (float32, temperature 2/3: 12; float64: 17): a batch's operations
# have at least this many elements per pair, which decides whether torch runs them on several threads.
_MIN_NODES = 12


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

    A batch large enough for torch to run in parallel is computed under
    :func:`~l0bayes.threads.thread_policy` (one intra-op thread unless you chose otherwise; torch's count
    is restored after): with more threads that spin while they wait, the KL of :math:`10^6` pairs can
    run a hundred times slower beside one other busy process.
    """
    if not isinstance(q, HardConcrete) or not isinstance(p, HardConcrete):
        raise TypeError(f"kl_hard_concrete expects two HardConcrete, got {type(q).__name__} and {type(p).__name__}")
    if method not in KL_METHODS:
        raise ValueError(f"method must be one of {KL_METHODS}, got {method!r}")
    if num_nodes is not None:
        check_num_nodes(num_nodes)
    batch_shape = torch.broadcast_shapes(q.batch_shape, p.batch_shape)
    if method == "monte_carlo" and (
        isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1
    ):
        raise ValueError(f"num_samples must be a positive integer, got {num_samples!r}")
    per_pair = num_samples if method == "monte_carlo" else _MIN_NODES
    with policy_for(batch_shape.numel() * per_pair):
        return _kl(q, p, batch_shape, method, num_nodes, num_samples)


def _kl(q, p, batch_shape, method, num_nodes, num_samples):
    shared = _shared_scalars(q, p) if method == "quadrature" else None
    if shared is not None:
        # Every gate has the same temperature and stretch as the others and as p, and only
        # q's log_alpha can carry a gradient (the gates of a layer against a fixed prior).
        bq, bp, ap, lower, upper = shared
        return kl_shared_parameters(q._finite_log_alpha().expand(batch_shape), bq, ap, bp, lower, upper, num_nodes)
    q, p = q.expand(batch_shape), p.expand(batch_shape)

    if method == "monte_carlo":
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

    # q's infinite log_alpha is made finite (its limit, exactly); p's stays: a point-mass prior gives inf.
    return map_chunks(run, q._params() + (p.log_alpha, p.temperature, p.lower, p.upper), batch_shape)


def kl_shared_parameters(log_alpha, temperature, prior_log_alpha, prior_temperature, lower, upper, num_nodes=None):
    r"""Eq. 28 for gates that differ only in ``log_alpha``, against one prior with the same stretch.

    The same value as :func:`kl_hard_concrete` of ``HardConcrete(log_alpha, temperature, lower, upper)``
    and ``HardConcrete(prior_log_alpha, prior_temperature, lower, upper)``, without building the
    distributions: the hot path of a Bayesian training step (one call per group of gates). Every
    argument but ``log_alpha`` (a tensor, differentiable) is a Python float; the gradient is in closed
    form (:class:`_SharedParametersKL`). ``log_alpha`` must be finite (:func:`kl_hard_concrete` takes
    infinite values to their limit).
    """
    if num_nodes is None:
        v0, v1 = math.log(-lower) - math.log(upper), math.log1p(-lower) - math.log(upper - 1.0)
        num_nodes = num_nodes_for(max(temperature, prior_temperature), 0.5 * (v1 - v0), log_alpha.dtype)
    with policy_for(log_alpha.numel() * num_nodes):  # as kl_hard_concrete
        return _SharedParametersKL.apply(
            log_alpha, temperature, prior_temperature, prior_log_alpha, lower, upper, num_nodes
        )


def _kl_atoms(q, p):
    """Q0 log(Q0/P0) + Q1 log(Q1/P1), the logs from logsigmoid; a term with Q = 0 is 0 (also where P = 0)."""
    qL0, qL1 = q._logistic_bounds()
    pL0, pL1 = p._logistic_bounds()
    q0, q1 = torch.sigmoid(qL0), torch.sigmoid(-qL1)
    t0 = q0 * (log_sigmoid(qL0) - log_sigmoid(pL0))
    t1 = q1 * (log_sigmoid(-qL1) - log_sigmoid(-pL1))
    return torch.where(q0 > 0, t0, 0.0) + torch.where(q1 > 0, t1, 0.0)


def _kl_quadrature(q, p, num_nodes, same_stretch):
    v, w = q.continuous_quadrature(num_nodes)
    if same_stretch:
        # Same (lower, upper): p's logit variable at z(v) is v itself and the Jacobians cancel.
        bq, bp = q.temperature.unsqueeze(-1), p.temperature.unsqueeze(-1)
        aq, ap = q.log_alpha.unsqueeze(-1), p.log_alpha.unsqueeze(-1)
        log_ratio = log_logistic_density(bq * v - aq) - log_logistic_density(bp * v - ap)
        log_temperatures = torch.log(q.temperature) - torch.log(p.temperature)
        continuous = torch.where(w > 0, w * log_ratio, 0.0).sum(-1) + q.prob_continuous * log_temperatures
    else:
        log_ratio = q._continuous_log_density(v) - _stretched_log_density_at(p, q, v)
        continuous = torch.where(w > 0, w * log_ratio, 0.0).sum(-1)
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
        z = torch.linspace(0.0, 1.0, 65, dtype=torch.float64, device=lq.device).unsqueeze(-1)
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


def _scalar(t):
    """The value of a tensor that is a scalar or an expanded scalar (all strides 0) as a float, else None."""
    if t.requires_grad or not (t.numel() == 1 or all(st == 0 for st in t.stride())):
        return None
    return float(t.as_strided((), ()))


def _shared_scalars(q, p):
    """``(temperature_q, temperature_p, log_alpha_p, lower, upper)`` as floats when the fast path applies."""
    if not q.log_alpha.numel():
        return None
    values = [_scalar(t) for t in (q.temperature, p.temperature, p.log_alpha, q.lower, q.upper, p.lower, p.upper)]
    if any(v is None for v in values):
        return None
    bq, bp, ap, lq, uq, lp, up = values
    if lq != lp or uq != up or not math.isfinite(ap):
        return None
    return bq, bp, ap, lq, uq


#: The constants of :func:`_shared_constants` by their arguments, oldest first (at most 64 entries).
_SHARED_CONSTANTS = {}


def _shared_constants(bq, bp, ap, lower, upper, num_nodes, dtype, device):
    """Nodes, scaled weights and prior log density on the nodes (tensors), and the scalar constants; cached.

    A plain dictionary rather than ``functools.lru_cache``: inside ``torch.compile`` the lookup is traced
    and the cached tensors become constants of the graph (a cache wrapper would be traced through, down
    to NumPy's Gauss-Legendre rule, and break the graph).
    """
    key = (bq, bp, ap, lower, upper, num_nodes, dtype, device)
    if key not in _SHARED_CONSTANTS:
        if len(_SHARED_CONSTANTS) >= 64:
            _SHARED_CONSTANTS.pop(next(iter(_SHARED_CONSTANTS)), None)
        _SHARED_CONSTANTS[key] = _compute_shared_constants(*key)
    return _SHARED_CONSTANTS[key]


def _compute_shared_constants(bq, bp, ap, lower, upper, num_nodes, dtype, device):
    x, w = _legendre_numpy(num_nodes)
    v0 = math.log(-lower) - math.log(upper)
    v1 = math.log1p(-lower) - math.log(upper - 1.0)
    half, centre = 0.5 * (v1 - v0), 0.5 * (v0 + v1)
    v = torch.as_tensor(centre + half * x, dtype=torch.float64)
    prior_log_density = log_logistic_density(bp * v - ap)
    v = bq * v  # the forward pass only needs temperature_q * v
    as_dtype = {"dtype": dtype, "device": device}
    scalars = (
        v0,
        v1,
        float(log_sigmoid(torch.tensor(bp * v0 - ap, dtype=torch.float64))),
        float(log_sigmoid(torch.tensor(ap - bp * v1, dtype=torch.float64))),
        math.log(bq) - math.log(bp),
    )
    return (
        v.to(**as_dtype),
        torch.as_tensor(w * (bq * half), **as_dtype),
        prior_log_density.to(**as_dtype),
        scalars,
    )


class _SharedParametersKL(torch.autograd.Function):
    r"""Eq. 28 for a batch of gates that differ only in ``log_alpha``, with the gradient in closed form.

    With :math:`t_k = \beta v_k - \log\alpha` on the fixed Gauss-Legendre nodes :math:`v_k` of
    ``(v0, v1)``, the quadrature weights are :math:`w_k = c_k f(t_k)` (``f`` the logistic density)
    and :math:`KL = Q_0 r_0 + Q_1 r_1 + \sum_k w_k \ell_k + P_c \log(\beta_q/\beta_p)` with
    :math:`r_0 = \log Q_0 - \log P_0`, :math:`r_1 = \log Q_1 - \log P_1` and
    :math:`\ell_k` the log ratio of the logistic densities. Differentiating this very sum
    (the nodes do not move with :math:`\log\alpha`) gives

    .. math::
        \frac{\partial KL}{\partial \log\alpha} = -Q_0\sigma(-L_0)(r_0 + 1) + Q_1\sigma(L_1)(r_1 + 1)
        + \sum_k w_k \tanh(t_k/2)(\ell_k + 1) + (Q_0\sigma(-L_0) - Q_1\sigma(L_1))\log\frac{\beta_q}{\beta_p},

    computed in the same pass, so the backward is one multiplication instead of an autograd
    graph over ``num_gates x num_nodes`` temporaries (the dominant cost of an SVI step). The
    constants (nodes, the prior's log density on them) are computed once in float64 and cached;
    batches are processed in chunks of :data:`~l0bayes.distributions.quadrature.CHUNK_SIZE`.
    """

    @staticmethod
    def forward(ctx, log_alpha, bq, bp, ap, lower, upper, num_nodes):
        flat = log_alpha.detach().reshape(-1)
        bv, scaled_weights, prior_log_density, scalars = _shared_constants(
            bq, bp, ap, lower, upper, num_nodes, flat.dtype, flat.device
        )
        v0, v1, p_log0, p_log1, log_temperatures = scalars
        out = torch.empty_like(flat)
        grad = torch.empty_like(flat)
        for i in range(0, flat.numel(), CHUNK_SIZE):
            a = flat[i : i + CHUNK_SIZE]
            t = bv - a.unsqueeze(-1)
            log_density = log_logistic_density(t)
            w = scaled_weights * torch.exp(log_density)
            log_ratio = log_density - prior_log_density
            L0, L1 = bq * v0 - a, bq * v1 - a
            q0, q1 = torch.sigmoid(L0), torch.sigmoid(-L1)
            r0, r1 = log_sigmoid(L0) - p_log0, log_sigmoid(-L1) - p_log1
            d0, d1 = q0 * torch.sigmoid(-L0), q1 * torch.sigmoid(L1)
            out[i : i + CHUNK_SIZE] = (
                q0 * r0 + q1 * r1 + (w * log_ratio).sum(-1) + sigmoid_difference(L1, L0) * log_temperatures
            )
            grad[i : i + CHUNK_SIZE] = (
                d1 * (r1 + 1.0)
                - d0 * (r0 + 1.0)
                + (w * torch.tanh(0.5 * t) * (log_ratio + 1.0)).sum(-1)
                + (d0 - d1) * log_temperatures
            )
        ctx.save_for_backward(grad.reshape(log_alpha.shape))
        return out.reshape(log_alpha.shape)

    @staticmethod
    def backward(ctx, grad_output):
        (grad,) = ctx.saved_tensors
        return grad_output * grad, None, None, None, None, None, None


@register_kl(HardConcrete, HardConcrete)
def _kl_hard_concrete_hard_concrete(q, p):
    return kl_hard_concrete(q, p)
