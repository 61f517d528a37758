r"""A structured variational family for linear variable selection: a sum of single effects.

The coefficient vector is :math:`b = \sum_{l=1}^{L} b_l`, each :math:`b_l` having exactly one
non-zero entry: :math:`b_l = \beta_l\, e_{j_l}` with :math:`j_l \sim \mathrm{Categorical}(\pi)`
and :math:`\beta_l \sim N(0, V_l)` (Wang et al., 2020, "A simple new approach to variable
selection in regression", the model called SuSiE). The guide keeps that structure,
:math:`q(b) = \prod_l q(j_l)\, q(\beta_l \mid j_l)`: each effect chooses *one* of a group of
correlated features with probabilities :math:`\alpha_{l\cdot}` and so spreads its mass over
the group instead of committing to one member, which a mean-field guide over independent gates
cannot do (see docs/mathematics.md and the variable-selection guide).

Fitting is coordinate ascent on the ELBO (iterative Bayesian stepwise selection): with the
other effects fixed, the optimal :math:`q_l` is the exact posterior of a single-effect
regression on the residual :math:`r_l = y - X\sum_{k \ne l} \bar b_k`. For standardised
columns with :math:`d_j = x_j^\top x_j`, :math:`\hat\beta_j = x_j^\top r_l / d_j` and
:math:`s_j^2 = \sigma^2 / d_j`,

.. math::
    \log \mathrm{BF}_j(V) = \tfrac12 \log\frac{s_j^2}{V + s_j^2} + \frac{\hat\beta_j^2 V}{2 s_j^2 (V + s_j^2)},
    \qquad \alpha_{lj} \propto \pi_j \mathrm{BF}_j(V_l),

and :math:`q(\beta_l \mid j) = N(\mu_{lj}, v_{lj})` with :math:`v_{lj} = (1/V_l + d_j/\sigma^2)^{-1}`,
:math:`\mu_{lj} = v_{lj}\, x_j^\top r_l / \sigma^2`. The prior variance :math:`V_l` maximises the
effect's evidence :math:`\sum_j \pi_j \mathrm{BF}_j(V)` over a log-spaced grid (an effect whose
best evidence does not beat :math:`V = 0` is switched off); :math:`\sigma^2` is the expected
residual sum of squares over :math:`n`. Iterations stop when the ELBO changes by less than
``tol`` nats: the rule is on the objective, not on an iteration count.
"""

import math
from dataclasses import dataclass, field

import numpy as np
import torch

GRID_DECADES = (-4.0, 1.0)
GRID_POINTS = 41
LOCAL = 4
GROW_EVIDENCE = math.log(10.0)


@dataclass
class SingleEffectsFit:
    r"""Result of :func:`fit_single_effects` (tensors on the device of the data).

    :ivar alpha: ``(L, p)`` :math:`q(j_l = j)`.
    :ivar mu: ``(L, p)`` :math:`E[\beta_l \mid j_l = j]`.
    :ivar var: ``(L, p)`` :math:`\mathrm{Var}[\beta_l \mid j_l = j]`.
    :ivar prior_variance: ``(L,)`` :math:`V_l` (0 for a switched-off effect).
    :ivar noise_variance: :math:`\sigma^2`.
    :ivar elbo: the ELBO after each sweep.
    :ivar converged: whether the ELBO stabilised before ``max_iter`` sweeps.
    :ivar log_evidence: ``(L,)`` each effect's log Bayes factor against no effect, at the last sweep.
    """

    alpha: torch.Tensor
    mu: torch.Tensor
    var: torch.Tensor
    prior_variance: torch.Tensor
    noise_variance: float
    elbo: list = field(default_factory=list)
    converged: bool = False
    log_evidence: torch.Tensor = None

    @property
    def active(self):
        """Boolean ``(L,)``: effects with a positive prior variance."""
        return self.prior_variance > 0

    def inclusion_probabilities(self):
        r""":math:`1 - \prod_{l \text{ active}} (1 - \alpha_{lj})`, the probability that some effect picks ``j``."""
        alpha = self.alpha[self.active]
        return -torch.expm1(torch.log1p(-alpha).sum(0))

    def coefficients(self):
        r"""Posterior mean :math:`E[b] = \sum_l \alpha_l \odot \mu_l`."""
        return (self.alpha * self.mu)[self.active].sum(0)


def _log_bayes_factors(bhat, s2, prior_variance):
    """``log BF_j(V)`` for a grid of ``V``: ``prior_variance`` of shape ``(G, 1)``, the rest ``(p,)``."""
    total = prior_variance + s2
    return 0.5 * torch.log(s2 / total) + 0.5 * bhat**2 * prior_variance / (s2 * total)


def _best_prior_variance(bhat, s2, log_prior, grid, previous):
    """Index into ``grid`` of the ``V`` with the largest evidence, its ``log BF`` and that evidence.

    Searched in a window of :data:`LOCAL` grid points on each side of ``previous`` (the effect's
    last value), after a coarse pass over every :data:`LOCAL`-th grid point when there is none;
    a best value on the window's edge moves the window.
    """
    if previous is None:
        coarse = torch.arange(0, grid.numel(), LOCAL, device=grid.device)
        lbf = _log_bayes_factors(bhat, s2, grid[coarse, None])
        previous = int(coarse[int(torch.argmax(torch.logsumexp(lbf + log_prior, dim=1)))])
    while True:
        lo, hi = max(previous - LOCAL, 0), min(previous + LOCAL + 1, grid.numel())
        lbf = _log_bayes_factors(bhat, s2, grid[lo:hi, None])  # (G, p)
        evidence = torch.logsumexp(lbf + log_prior, dim=1)
        best = int(torch.argmax(evidence))
        on_edge = (best == 0 and lo > 0) or (best == hi - lo - 1 and hi < grid.numel())
        if not on_edge:
            return lo + best, lbf[best], float(evidence[best])
        previous = lo + best


def _single_effect(xtr, d, noise_variance, log_prior, grid, previous=None):
    """The optimal ``q_l`` of one effect given the residual's ``X^T r``: alpha, mu, var, V, log evidence, grid index."""
    bhat, s2 = xtr / d, noise_variance / d
    index, lbf, evidence = _best_prior_variance(bhat, s2, log_prior, grid, previous)
    if evidence <= 0.0:  # no grid value beats V = 0: the effect is off
        zero = torch.zeros_like(xtr)
        return log_prior.exp().expand_as(xtr).clone(), zero, zero, 0.0, 0.0, None
    prior_variance = float(grid[index])
    alpha = torch.softmax(lbf + log_prior, dim=0)
    var = 1.0 / (1.0 / prior_variance + d / noise_variance)
    return alpha, var * xtr / noise_variance, var, prior_variance, evidence, index


def _grow(fit, num_effects):
    """Append switched-off effects to ``fit`` so that it has ``num_effects`` of them."""
    extra = num_effects - fit.alpha.shape[0]
    p = fit.alpha.shape[1]
    pad = fit.alpha.new_zeros(extra, p)
    fit.alpha = torch.cat([fit.alpha, pad + 1.0 / p])
    fit.mu = torch.cat([fit.mu, pad])
    fit.var = torch.cat([fit.var, pad])
    fit.prior_variance = torch.cat([fit.prior_variance, fit.prior_variance.new_zeros(extra)])
    fit.log_evidence = torch.cat([fit.log_evidence, fit.log_evidence.new_zeros(extra)])
    return fit


def credible_sets(x, alpha, active, coverage=0.95, min_abs_corr=0.5, max_size=200):
    """95% credible sets of the single effects: the fewest features holding ``coverage`` of an effect's probability.

    A set is kept when the smallest absolute correlation between two of its members is at
    least ``min_abs_corr`` (a pure set: all members explain the same signal); duplicates are
    dropped. Returns the sets (index arrays) and the effects they came from.
    """
    out, seen, effects = [], set(), []
    for l in torch.nonzero(active).flatten().tolist():
        probs, order = torch.sort(alpha[l], descending=True)
        level = torch.tensor(coverage, dtype=probs.dtype, device=probs.device)
        size = int(torch.searchsorted(torch.cumsum(probs, 0), level)) + 1
        members = tuple(sorted(order[: min(size, probs.numel())].tolist()))
        if len(members) > max_size or members in seen:
            continue
        if len(members) > 1:
            corr = torch.corrcoef(x[:, list(members)].T).abs()
            if float(corr.min()) < min_abs_corr:
                continue
        seen.add(members)
        out.append(np.asarray(members))
        effects.append(l)
    return out, effects


def fit_single_effects(
    x, y, num_effects=10, noise_variance=None, max_iter=100, tol=1e-3, grow=True, max_effects=None, init=None
):
    r"""Fit the sum of single effects to centred ``x`` (columns with positive norm) and centred ``y``.

    :param x: ``(n, p)`` tensor, columns centred.
    :param y: ``(n,)`` tensor, centred.
    :param int num_effects: :math:`L` to start with.
    :param noise_variance: :math:`\sigma^2` fixed when given, else estimated.
    :param int max_iter: at most this many sweeps per stage.
    :param float tol: stop when the ELBO changes by less than ``tol`` nats between sweeps.
    :param bool grow: when every effect has found a signal at convergence (each effect's Bayes
        factor against no effect exceeds 10), double :math:`L` (warm start) and continue, up
        to ``max_effects`` (default ``min(p, 200)``): the number of effects is then found from
        the data, not guessed.
    :param init: a :class:`SingleEffectsFit` to start from (default: every effect off).
    :returns: :class:`SingleEffectsFit`.
    """
    n, p = x.shape
    d = (x * x).sum(0)
    yy = float(y @ y)
    log_prior = torch.full((p,), -math.log(p), dtype=x.dtype, device=x.device)
    fixed = noise_variance is not None
    sigma2 = float(noise_variance) if fixed else yy / max(n - 1, 1)
    grid = (yy / max(n - 1, 1)) * torch.logspace(*GRID_DECADES, GRID_POINTS, dtype=x.dtype, device=x.device)
    max_effects = min(p, 200) if max_effects is None else int(max_effects)
    num_effects = min(int(num_effects), max_effects)
    if init is None:
        zeros = x.new_zeros(num_effects, p)
        init = SingleEffectsFit(zeros + 1.0 / p, zeros.clone(), zeros.clone(), x.new_zeros(num_effects), sigma2)
        init.log_evidence = x.new_zeros(num_effects)
    fit = init
    while True:
        fit = _sweeps(x, y, d, yy, log_prior, grid, fit, fixed, max_iter, tol)
        L = fit.alpha.shape[0]
        if not grow or L >= max_effects or int((fit.log_evidence > GROW_EVIDENCE).sum()) < L:
            return fit
        fit = _grow(fit, min(2 * L, max_effects))


def _sweeps(x, y, d, yy, log_prior, grid, fit, fixed, max_iter, tol):
    """Coordinate-ascent sweeps over the effects until the ELBO stabilises."""
    n = x.shape[0]
    L = fit.alpha.shape[0]
    sigma2 = fit.noise_variance
    # Products with X in float32 (half the memory traffic of the two products per effect, which
    # dominate the cost); everything they feed is accumulated in float64.
    xf = x.to(torch.float32) if x.dtype == torch.float64 else x
    fitted = (xf @ (fit.alpha * fit.mu).T.to(xf.dtype)).to(x.dtype)  # (n, L): X b_l per effect
    total = fitted.sum(1)
    kl = [0.0] * L
    where = [None] * L
    fit.elbo, fit.converged = [], False
    for _ in range(max_iter):
        for l in range(L):
            resid = y - total + fitted[:, l]
            xtr = (xf.T @ resid.to(xf.dtype)).to(x.dtype)
            alpha, mu, var, prior_variance, log_evidence, where[l] = _single_effect(
                xtr, d, sigma2, log_prior, grid, where[l]
            )
            fit.alpha[l], fit.mu[l], fit.var[l], fit.prior_variance[l] = alpha, mu, var, prior_variance
            fit.log_evidence[l] = log_evidence
            new = (xf @ (alpha * mu).to(xf.dtype)).to(x.dtype)
            second = float((d * alpha * (mu**2 + var)).sum())
            kl[l] = (2.0 * float(resid @ new) - second) / (2.0 * sigma2) - log_evidence
            total = total - fitted[:, l] + new
            fitted[:, l] = new
        second = (d * fit.alpha * (fit.mu**2 + fit.var)).sum(1)
        erss = float(((y - total) ** 2).sum() + (second - (fitted**2).sum(0)).sum())
        if not fixed:
            sigma2 = max(erss / n, 1e-12 * yy / n)
        fit.noise_variance = sigma2
        elbo = -0.5 * n * math.log(2 * math.pi * sigma2) - erss / (2 * sigma2) - sum(kl)
        fit.elbo.append(elbo)
        if len(fit.elbo) > 1 and abs(fit.elbo[-1] - fit.elbo[-2]) < tol:
            fit.converged = True
            break
    return fit
