"""Brute-force references for the conjugate spike-and-slab model, independent of l0bayes.analysis.exact.

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
