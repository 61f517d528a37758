"""Brute-force references for the conjugate spike-and-slab model, independent of l0bayes.selection.exact.

* :func:`log_marginal_dense`: ``log N(y; 0, sigma^2 I + tau^2 X_S X_S^T)`` with SciPy's
  n-dimensional multivariate normal (no Woodbury identity, no Cholesky of the small system);
* :func:`log_marginal_quadrature`: the coefficients integrated out numerically (1 or 2 of them)
  with ``scipy.integrate.quad`` (one) or a fine 2-d grid (two);
* :func:`inclusion_importance_sampling`: posterior inclusion probabilities by drawing
  ``(gamma, b)`` from the prior and weighting by the likelihood (no closed form at all).
"""

import itertools

import numpy as np
from scipy import integrate, stats
from scipy.special import logsumexp


def log_marginal_dense(x, y, subset, tau, sigma):
    xs = x[:, np.asarray(subset, dtype=bool)]
    cov = sigma**2 * np.eye(len(y)) + tau**2 * xs @ xs.T
    return stats.multivariate_normal(np.zeros(len(y)), cov).logpdf(y)


def _log_joint(b, xs, y, tau, sigma):
    resid = y - xs @ b
    return stats.norm.logpdf(resid, scale=sigma).sum() + stats.norm.logpdf(b, scale=tau).sum()


def log_marginal_quadrature(x, y, subset, tau, sigma):
    """``log int p(y | b) p(b) db`` for one or two included features, by adaptive quadrature."""
    xs = x[:, np.asarray(subset, dtype=bool)]
    k = xs.shape[1]
    if k not in (1, 2):
        raise ValueError("quadrature reference for 1 or 2 coefficients only")
    # centre and scale the integral at the posterior mode (ridge) so exp() stays in range
    mode = np.linalg.solve(xs.T @ xs + (sigma / tau) ** 2 * np.eye(k), xs.T @ y)
    sd = np.sqrt(np.diag(np.linalg.inv(xs.T @ xs / sigma**2 + np.eye(k) / tau**2)))
    shift = _log_joint(mode, xs, y, tau, sigma)
    lo, hi = mode - 12 * sd, mode + 12 * sd
    if k == 1:
        val, _ = integrate.quad(
            lambda b: np.exp(_log_joint(np.array([b]), xs, y, tau, sigma) - shift),
            lo[0],
            hi[0],
            epsabs=0,
            epsrel=1e-10,
            limit=200,
        )
    else:  # trapezoid rule on a fine grid (spectrally accurate for a smooth integrand that vanishes at the ends)
        g0, g1 = np.linspace(lo[0], hi[0], 601), np.linspace(lo[1], hi[1], 601)
        b = np.stack(np.meshgrid(g0, g1, indexing="ij"), -1).reshape(-1, 2)
        resid = y[None, :] - b @ xs.T
        logj = stats.norm.logpdf(resid, scale=sigma).sum(1) + stats.norm.logpdf(b, scale=tau).sum(1)
        val = np.exp(logj - shift).sum() * (g0[1] - g0[0]) * (g1[1] - g1[0])
    return np.log(val) + shift


def inclusion_dense(x, y, pi0, tau, sigma):
    """Posterior inclusion by enumeration with :func:`log_marginal_dense`."""
    p = x.shape[1]
    models = [np.array(m, dtype=bool) for m in itertools.product([0, 1], repeat=p)]
    logw = np.array(
        [
            log_marginal_dense(x, y, m, tau, sigma) + m.sum() * np.log(pi0) + (p - m.sum()) * np.log1p(-pi0)
            for m in models
        ]
    )
    w = np.exp(logw - logsumexp(logw))
    return sum(wi * m for wi, m in zip(w, models, strict=True))


def inclusion_importance_sampling(x, y, pi0, tau, sigma, num_samples, rng):
    """Self-normalised importance sampling from the prior; returns (estimate, standard error)."""
    p = x.shape[1]
    gamma = rng.random((num_samples, p)) < pi0
    b = rng.normal(0.0, tau, (num_samples, p)) * gamma
    resid = y[None, :] - b @ x.T
    logw = stats.norm.logpdf(resid, scale=sigma).sum(1)
    w = np.exp(logw - logsumexp(logw))
    est = w @ gamma
    se = np.sqrt((w[:, None] ** 2 * (gamma - est) ** 2).sum(0))  # delta-method SE of the ratio estimator
    return est, se


def log_marginal_logistic_quadrature(x, y, subset, tau, intercept_scale, points=12):
    r"""``log int prod_i Bernoulli(y_i; sigmoid(b_0 + x_i^T b)) N(b_0; 0, tau_0^2) N(b; 0, tau^2 I) db_0 db``.

    Adaptive Gauss-Hermite quadrature (a product grid of ``points`` nodes per coordinate, at most
    5 coordinates): the nodes are placed by the Laplace approximation at the posterior mode
    (Newton's method), so the integrand is close to the Gaussian weight the rule is exact for.
    """
    xs = np.column_stack([np.ones(len(y)), x[:, np.asarray(subset, dtype=bool)]])
    k = xs.shape[1]
    prec = np.r_[1.0 / intercept_scale**2, np.full(k - 1, 1.0 / tau**2)]

    def log_joint(b):  # b: (m, k)
        eta = b @ xs.T
        return (
            (y * eta - np.logaddexp(0.0, eta)).sum(-1)
            - 0.5 * (b * b * prec).sum(-1)
            + 0.5 * np.log(prec).sum()
            - 0.5 * k * np.log(2 * np.pi)
        )

    mode = np.zeros(k)
    for _ in range(100):  # Newton on the log posterior (concave)
        mu = 1.0 / (1.0 + np.exp(-(xs @ mode)))
        hess = xs.T @ (xs * (mu * (1 - mu))[:, None]) + np.diag(prec)
        step = np.linalg.solve(hess, xs.T @ (y - mu) - prec * mode)
        mode += step
        if np.abs(step).max() < 1e-12:
            break
    chol = np.linalg.cholesky(np.linalg.inv(hess))
    nodes, weights = np.polynomial.hermite_e.hermegauss(points)  # weight exp(-u^2 / 2)
    grid = np.stack(np.meshgrid(*([nodes] * k), indexing="ij"), -1).reshape(-1, k)
    log_w = np.log(weights)[np.stack(np.meshgrid(*([np.arange(points)] * k), indexing="ij"), -1).reshape(-1, k)].sum(1)
    b = mode + grid @ chol.T
    # int f(b) db = |L| int f(mode + L u) du, and int g(u) du = sum_i w_i e^{u_i^2 / 2} g(u_i)
    terms = log_w + 0.5 * (grid**2).sum(1) + log_joint(b)
    return logsumexp(terms) + np.log(np.diag(chol)).sum()


def logistic_inclusion_quadrature(x, y, pi0, tau, intercept_scale, points=12):
    """Posterior inclusion of the spike-and-slab logistic model by enumerating its 2^p models (p <= 4)."""
    p = x.shape[1]
    if p > 4:
        raise ValueError("the quadrature reference is for at most 4 features")
    models = [np.array(m, dtype=bool) for m in itertools.product([0, 1], repeat=p)]
    logw = np.array(
        [
            log_marginal_logistic_quadrature(x, y, m, tau, intercept_scale, points)
            + m.sum() * np.log(pi0)
            + (p - m.sum()) * np.log1p(-pi0)
            for m in models
        ]
    )
    w = np.exp(logw - logsumexp(logw))
    return sum(wi * m for wi, m in zip(w, models, strict=True))
