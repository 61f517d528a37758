r"""Exact posterior inclusion probabilities of the conjugate spike-and-slab linear model.

The reference against which the variational gates of
:class:`~l0bayes.models.SparseLinearRegression` are judged (notebook 02). The model, for
centred data (no intercept), known noise :math:`\sigma` and :math:`p` candidate features:

.. math::
    \gamma_j \sim \mathrm{Bernoulli}(\pi_0),\quad
    b_j \mid \gamma_j = 1 \sim N(0, \tau^2),\quad
    y \mid \gamma, b \sim N(X_\gamma b_\gamma, \sigma^2 I_n),

with :math:`\pi_0` = ``prior_inclusion``, :math:`\tau` = ``slab_scale`` (the
``prior_scale`` of the Gaussian slab, Eq. 20) and :math:`\sigma` = ``noise_scale``. The
coefficients integrate out in closed form: :math:`y \mid \gamma \sim N(0, \sigma^2 I +
\tau^2 X_\gamma X_\gamma^\top)`, evaluated in :math:`|\gamma|` dimensions with
:math:`M = I + (\tau^2/\sigma^2) X_\gamma^\top X_\gamma`:

.. math::
    \begin{aligned}
    \log p(y \mid \gamma) = {}& -\tfrac n2 \log(2\pi\sigma^2) - \tfrac12 \log\det M\\
    & - \frac{1}{2\sigma^2}\Big(y^\top y - \frac{\tau^2}{\sigma^2}\, y^\top X_\gamma M^{-1} X_\gamma^\top y\Big).
    \end{aligned}

The posterior of :math:`\gamma` is then exact by enumerating all :math:`2^p` models, and
:math:`P(\gamma_j = 1 \mid y) = \sum_{\gamma \ni j} p(\gamma \mid y)`.
"""

import itertools
import math
from dataclasses import dataclass

import numpy as np

from .._checks import POSITIVE, PROBABILITY, check_args

MAX_FEATURES = 20

# The table of argument checks of exact_inclusion_probabilities. An infinite slab makes every
# Bayes factor of an included feature 0 (Lindley's paradox), so slab_scale must be finite.
ARG_CHECKS = {"prior_inclusion": PROBABILITY, "slab_scale": POSITIVE, "noise_scale": POSITIVE.or_none()}


@dataclass
class ExactSpikeSlab:
    """Result of :func:`exact_inclusion_probabilities`.

    :ivar inclusion: ``(p,)`` posterior inclusion probabilities :math:`P(\\gamma_j = 1 \\mid y)`.
    :ivar models: ``(2^p, p)`` boolean matrix, one row per model :math:`\\gamma`.
    :ivar log_marginal: ``(2^p,)`` :math:`\\log p(y \\mid \\gamma)`.
    :ivar model_probs: ``(2^p,)`` posterior model probabilities :math:`p(\\gamma \\mid y)`.
    :ivar coef_mean: ``(p,)`` model-averaged posterior mean of the coefficients.
    """

    inclusion: np.ndarray
    models: np.ndarray
    log_marginal: np.ndarray
    model_probs: np.ndarray
    coef_mean: np.ndarray

    def top_models(self, k=5, names=None):
        """The ``k`` most probable models as ``[(probability, [feature names])]``."""
        names = list(names) if names is not None else [str(j) for j in range(self.models.shape[1])]
        order = np.argsort(-self.model_probs)[:k]
        return [
            (float(self.model_probs[i]), [n for n, on in zip(names, self.models[i], strict=True) if on]) for i in order
        ]


def log_marginal_likelihood(x, y, subset, slab_scale, noise_scale):
    r""":math:`\log p(y \mid \gamma)` of the conjugate model for the features in ``subset`` (a boolean mask).

    With :math:`A = [(\tau/\sigma) X_\gamma;\ I]` (so :math:`A^\top A = M`) and :math:`c` the
    least-squares solution of :math:`A c \approx [y; 0]`, the quadratic form is the residual
    :math:`y^\top y - \frac{\tau^2}{\sigma^2} y^\top X_\gamma M^{-1} X_\gamma^\top y =
    \lVert y - (\tau/\sigma) X_\gamma c\rVert^2 + \lVert c\rVert^2`, a sum of non-negative terms
    computed from the residual itself: nothing cancels when :math:`\sigma` is tiny (the
    difference of the two large terms would). :math:`\log\det M = 2\sum_i \log|R_{ii}|` from the QR
    factor of :math:`A`.
    """
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    n = y.shape[0]
    sigma, tau = float(noise_scale), float(slab_scale)
    xs = x[:, np.asarray(subset, dtype=bool)]
    k = xs.shape[1]
    if k == 0:
        return -0.5 * n * math.log(2 * math.pi) - n * math.log(sigma) - 0.5 * float(y @ y) / sigma**2
    scaled = (tau / sigma) * xs
    q, r = np.linalg.qr(np.vstack([scaled, np.eye(k)]))
    c = np.linalg.solve(r, q.T @ np.concatenate([y, np.zeros(k)]))
    resid = y - scaled @ c
    quadratic = float(resid @ resid) + float(c @ c)
    log_det = 2.0 * np.log(np.abs(np.diag(r))).sum()
    return -0.5 * n * math.log(2 * math.pi) - n * math.log(sigma) - 0.5 * log_det - 0.5 * quadratic / sigma**2


def exact_inclusion_probabilities(x, y, prior_inclusion=0.5, slab_scale=1.0, noise_scale=None):
    r"""Posterior inclusion probabilities by enumerating all :math:`2^p` models (see the module docstring).

    :param x: ``(n, p)`` design matrix, centred (the model has no intercept); ``p <= 20``.
    :param y: ``(n,)`` centred response.
    :param float prior_inclusion: :math:`\pi_0 \in (0, 1)`.
    :param float slab_scale: :math:`\tau > 0`, the prior standard deviation of an included coefficient.
    :param noise_scale: :math:`\sigma > 0`; ``None`` uses the residual standard deviation of the
        full least-squares fit, :math:`\sqrt{\mathrm{RSS}/(n - p)}`.
    :returns: :class:`ExactSpikeSlab`.
    """
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if x.ndim != 2 or y.ndim != 1 or x.shape[0] != y.shape[0]:
        raise ValueError(f"need x of shape (n, p) and y of shape (n,), got {x.shape} and {y.shape}")
    n, p = x.shape
    if p > MAX_FEATURES:
        raise ValueError(f"enumeration of 2^{p} models is too large; at most {MAX_FEATURES} features")
    if not (np.isfinite(x).all() and np.isfinite(y).all()):
        raise ValueError("exact_inclusion_probabilities: x and y must be finite")
    owner = "exact_inclusion_probabilities"
    check_args(owner, ARG_CHECKS, prior_inclusion=prior_inclusion, slab_scale=slab_scale, noise_scale=noise_scale)
    if noise_scale is None:
        noise_scale = ols_noise_scale(x, y)
        if not noise_scale > 0:
            raise ValueError(f"{owner}: y is fitted exactly (residual 0); pass noise_scale explicitly")
    # (with p = 0 the one model is the empty one: a (1, 0) matrix, which reshape(-1, 0) cannot infer)
    models = np.array(list(itertools.product([False, True], repeat=p)), dtype=bool).reshape(2**p, p)
    log_ml = np.array([log_marginal_likelihood(x, y, m, slab_scale, noise_scale) for m in models])
    size = models.sum(1)
    log_prior = size * math.log(prior_inclusion) + (p - size) * math.log1p(-prior_inclusion)
    log_post = log_ml + log_prior
    log_post -= log_post.max()
    probs = np.exp(log_post)
    probs /= probs.sum()
    ratio = (noise_scale / slab_scale) ** 2
    coef = np.zeros(p)
    for m, w in zip(models, probs, strict=True):
        if m.any():
            xs = x[:, m]
            coef[m] += w * np.linalg.solve(xs.T @ xs + ratio * np.eye(m.sum()), xs.T @ y)
    return ExactSpikeSlab(probs @ models, models, log_ml, probs, coef)


def ols_noise_scale(x, y):
    r"""Residual standard deviation of the least-squares fit without intercept, :math:`\sqrt{\mathrm{RSS}/(n - p)}`."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    n, p = x.shape
    if n <= p:
        raise ValueError(f"need more rows than columns to estimate the noise, got n={n}, p={p}")
    beta, *_ = np.linalg.lstsq(x, y, rcond=None)
    resid = y - x @ beta
    return math.sqrt(float(resid @ resid) / (n - p))
