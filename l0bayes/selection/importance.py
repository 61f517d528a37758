r"""Checking inclusion probabilities against the exact collapsed posterior, by Pareto-smoothed importance sampling.

For the conjugate spike-and-slab linear model of :mod:`l0bayes.selection.exact`
(:math:`\gamma_j \sim \mathrm{Bernoulli}(\pi_0)`, :math:`b_j \mid \gamma_j = 1 \sim N(0, \tau^2)`,
:math:`y \mid \gamma, b \sim N(X_\gamma b_\gamma, \sigma^2 I)`, centred data) the coefficients
integrate out, so the unnormalised posterior of the inclusion indicators is exact for any
:math:`\gamma`:

.. math::
    \log \tilde p(\gamma \mid y) = \log p(y \mid \gamma) + |\gamma| \log \pi_0 + (p - |\gamma|) \log(1 - \pi_0)

(the closed form of :math:`\log p(y \mid \gamma)` is on the mathematics page, docs/mathematics.md).
Any approximation that gives inclusion probabilities :math:`a_j` defines a proposal
:math:`q(\gamma) = \prod_j a_j^{\gamma_j} (1 - a_j)^{1 - \gamma_j}`; for the mean-field hard
concrete guide that product is exact, since :math:`\gamma_j = [z_j \ne 0]` with
:math:`P(z_j \ne 0) = q(z_j \ne 0)` (Eq. 12) and the gates are independent. Draws
:math:`\gamma^{(s)} \sim q` with log weights :math:`\log \tilde p(\gamma^{(s)} \mid y) - \log q(\gamma^{(s)})`
give self-normalised estimates :math:`\hat P(\gamma_j = 1 \mid y) = \sum_s w_s \gamma^{(s)}_j`.
Pareto smoothing of the largest weights (PSIS; Vehtari et al., 2024) stabilises them, and the
fitted shape :math:`\hat k` is the diagnostic of Yao et al. (2018, "Yes, but did it work?"):
with :math:`\hat k \le 0.7` the reweighted estimates are reliable; above 0.7 the proposal misses
posterior mass that matters and neither the proposal's probabilities nor the reweighted ones
should be trusted.

:math:`\hat k` is the shape of a generalised Pareto distribution fitted to the largest weights,
so it says how heavy their tail is (:func:`khat_meaning` puts it in words):

* :math:`\hat k < 0`: the tail is *bounded*, lighter than exponential: the weights cannot get
  much larger than the largest ones drawn. The best case: every moment of the weights is finite
  and the estimate is reliable. (When the largest weights are tied the fit degenerates and
  :math:`\hat k = -\infty`, the same case.)
* :math:`0 \le \hat k < 0.5`: heavier tail, finite variance; reliable.
* :math:`0.5 \le \hat k \le 0.7`: infinite variance, finite mean; Pareto smoothing still makes
  the estimate reliable, with more Monte Carlo error for the same number of draws.
* :math:`\hat k > 0.7`: the tail is too heavy for any practical number of draws; not reliable.
"""

import math
import warnings
from dataclasses import dataclass

import numpy as np
import torch

from .._optional import import_arviz
from .sampler.state import ChainState, check_gram

KHAT_THRESHOLD = 0.7
RB_MODELS = 256  # distinct drawn models Rao-Blackwellised at most (the heaviest)
RB_TAIL = 1e-6  # the weight left to the indicators
CHUNK = 128


@dataclass
class ImportanceCheck:
    r"""Result of :func:`importance_check`.

    :ivar khat: Pareto :math:`\hat k` of the importance weights (reliable when :math:`\le 0.7`;
        negative is the best case, a bounded tail: see :func:`khat_meaning`).
    :ivar ess: effective sample size :math:`1 / \sum_s w_s^2` of the smoothed weights.
    :ivar num_draws: number of proposal draws.
    :ivar inclusion: ``(p,)`` reweighted inclusion probabilities :math:`\hat P(\gamma_j = 1 \mid y)`.
    :ivar coef_mean: ``(p,)`` reweighted posterior mean of the coefficients, :math:`E[b_j \mid y]`.
    :ivar proposal: ``(p,)`` the proposal's own inclusion probabilities.
    :ivar draws: ``(S, p)`` boolean proposal draws.
    :ivar log_weights: ``(S,)`` their normalised, smoothed log weights.
    """

    khat: float
    ess: float
    num_draws: int
    inclusion: np.ndarray
    coef_mean: np.ndarray
    proposal: np.ndarray
    draws: np.ndarray
    log_weights: np.ndarray

    @property
    def reliable(self):
        r"""``True`` when :math:`\hat k \le 0.7`."""
        return bool(self.khat <= KHAT_THRESHOLD)

    @property
    def meaning(self):
        r"""What :attr:`khat` says, in words (:func:`khat_meaning`)."""
        return khat_meaning(self.khat)

    @property
    def max_shift(self):
        """Largest change that reweighting makes to a proposal probability."""
        return float(np.max(np.abs(self.inclusion - self.proposal)))


class _FullGram:
    r"""Gram entries read from the whole :math:`X^\top X` (``index`` padded with ``p``: a zero row and column)."""

    def __init__(self, gram):
        self.gram = gram
        self.p = gram.shape[0]

    def __call__(self, index):
        """``(S, K, K)`` Gram matrices of the rows of ``index``."""
        pad = index >= self.p
        safe = index.masked_fill(pad, 0)
        gram = self.gram[safe[:, :, None], safe[:, None, :]]
        return gram.masked_fill_(pad[:, :, None] | pad[:, None, :], 0.0)


class _GramCache:
    """Gram entries of the columns that occur in ``index`` (padded with ``p``, a zero column).

    Products with a ``core`` column come from one ``X_U^T X_core`` over the columns ``U`` that
    occur; the few products between two non-core columns of a draw are computed directly.
    """

    def __init__(self, x, index, core):
        n, p = x.shape
        self.p, self.k = p, core.numel()
        self.xa = torch.cat([x, x.new_zeros(n, 1)], dim=1)
        used = torch.unique(index)
        self.row_of = torch.zeros(p + 1, dtype=torch.long, device=x.device)
        self.row_of[used] = torch.arange(used.numel(), device=x.device)
        self.col_of = torch.full((p + 1,), self.k, dtype=torch.long, device=x.device)  # k: the zero column
        self.col_of[core] = torch.arange(self.k, device=x.device)
        self.cross = self.xa[:, used].T @ self.xa[:, torch.cat([core, core.new_full((1,), p)])]  # (|U|, k + 1)

    def __call__(self, index):
        """``(S, K, K)`` Gram matrices of the rows of ``index``."""
        width = index.shape[1]
        a, b = index[:, :, None].expand(-1, -1, width), index[:, None, :].expand(-1, width, -1)
        ca, cb = self.col_of[a], self.col_of[b]
        gram = torch.where(cb < self.k, self.cross[self.row_of[a], cb], self.cross[self.row_of[b], ca])
        rare = (ca == self.k) & (cb == self.k) & (a < self.p) & (b < self.p)
        if bool(rare.any()):
            ia, ib = a[rare], b[rare]
            gram[rare] = (self.xa[:, ia] * self.xa[:, ib]).sum(0)
        return gram


def collapsed_log_marginal(x, y, index, slab_scale, noise_scale, core=None, gram=None):
    r""":math:`\log p(y \mid \gamma)` and :math:`E[b_\gamma \mid y, \gamma]` for a batch of models.

    :param x: ``(n, p)`` tensor, centred.
    :param y: ``(n,)`` tensor, centred.
    :param index: ``(S, K)`` long tensor, the features of each model padded with ``p`` (a
        padded slot adds nothing to either quantity).
    :param core: features that occur in many models (their products with every column are
        computed once); default: every feature that occurs.
    :param gram: :math:`X^\top X` (``(p, p)``) where the caller has it: the models' Gram matrices are then
        read from it (``core`` is not needed).
    :returns: ``(S,)`` log marginal likelihoods (the closed form of
        :func:`~l0bayes.selection.log_marginal_likelihood`) and ``(S, K)`` conditional posterior
        means :math:`(X_\gamma^\top X_\gamma + \sigma^2/\tau^2 I)^{-1} X_\gamma^\top y`.
    """
    n, p = x.shape
    s2, t2 = float(noise_scale) ** 2, float(slab_scale) ** 2
    if core is None and gram is None:
        core = torch.unique(index[index < p])
    xty = torch.cat([x.T @ y, y.new_zeros(1)])
    base = -0.5 * n * math.log(2 * math.pi * s2) - 0.5 * float(y @ y) / s2
    out, coef = [], []
    eye = torch.eye(index.shape[1], dtype=x.dtype, device=x.device)
    if gram is None:
        gram = _GramCache(x, index, core)
    else:
        gram = _FullGram(check_gram(gram, x))
    for chunk in index.split(CHUNK * 8):
        chol = torch.linalg.cholesky(eye + (t2 / s2) * gram(chunk))
        rhs = xty[chunk].unsqueeze(-1)
        w = torch.linalg.solve_triangular(chol, rhs, upper=False)
        logdet = torch.log(torch.diagonal(chol, dim1=-2, dim2=-1)).sum(-1)
        out.append(base - logdet + 0.5 * (t2 / s2) * (w.squeeze(-1) ** 2).sum(-1) / s2)
        coef.append((t2 / s2) * torch.cholesky_solve(rhs, chol).squeeze(-1))
    return torch.cat(out), torch.cat(coef)


@dataclass
class BernoulliMixture:
    r"""A mixture of product-Bernoulli laws over :math:`\gamma \in \{0, 1\}^p`, sampled in :math:`O(S k)`.

    Features outside ``core`` (a boolean ``(p,)`` mask; default: probability at least ``1/p`` in
    some component) are *background*: within a component they share one probability (their
    mean), so a draw picks how many of them are on (binomial) and which (uniformly); the ``k``
    core features are drawn one by one. :meth:`log_prob` is exact for this law.
    """

    probs: torch.Tensor  # (C, p) as given
    weights: torch.Tensor  # (C,)
    core_mask: torch.Tensor = None

    def __post_init__(self):
        p = self.probs.shape[1]
        is_core = (self.probs >= 1.0 / p).any(0) if self.core_mask is None else self.core_mask.bool()
        self.core = torch.nonzero(is_core).flatten()
        self.background = torch.nonzero(~is_core).flatten()
        self.core_probs = self.probs[:, self.core]
        num_bg = self.background.numel()
        self.bg_prob = self.probs[:, self.background].mean(1) if num_bg else self.probs.new_zeros(len(self.probs))

    @property
    def marginal(self):
        """``(p,)`` inclusion probabilities of the mixture."""
        out = self.weights @ self.probs
        out[self.background] = self.weights @ self.bg_prob
        return out

    def sample(self, num, generator=None):
        """``(num, p)`` boolean draws, as an index tensor ``(num, K)`` padded with ``p``, and the draws' ``log q``."""
        p = self.probs.shape[1]
        comp = torch.multinomial(self.weights, num, replacement=True, generator=generator)
        u = torch.rand(num, self.core.numel(), dtype=self.probs.dtype, device=self.probs.device, generator=generator)
        on_core = u < self.core_probs[comp]
        rows = [self.core[r] for r in on_core]
        num_bg = self.background.numel()
        count = torch.zeros(num, dtype=torch.long, device=self.probs.device)
        if num_bg:
            count = torch.binomial(
                torch.full((num,), float(num_bg), dtype=self.probs.dtype, device=self.probs.device),
                self.bg_prob[comp],
                generator=generator,
            ).long()
            for s in torch.nonzero(count).flatten().tolist():
                pick = torch.randperm(num_bg, generator=generator, device=self.probs.device)[: int(count[s])]
                rows[s] = torch.cat([rows[s], self.background[pick]])
        width = max(max((r.numel() for r in rows), default=0), 1)
        index = torch.full((num, width), p, dtype=torch.long, device=self.probs.device)
        for s, r in enumerate(rows):
            index[s, : r.numel()] = r
        return index, self.log_prob(on_core, count)

    def log_prob(self, on_core, count):
        r"""Exact :math:`\log q(\gamma)` from the core indicators and the number of background features on."""
        a = self.core_probs  # (C, k)
        core = torch.where(on_core[:, None, :], torch.log(a), torch.log1p(-a)).sum(-1)  # (S, C)
        num_bg = self.background.numel()
        if num_bg:
            count = count.to(a.dtype)[:, None]
            core = core + count * torch.log(self.bg_prob) + (num_bg - count) * torch.log1p(-self.bg_prob)
        return torch.logsumexp(core + torch.log(self.weights), dim=1)


def khat_meaning(khat):
    r"""What a Pareto :math:`\hat k` of importance weights says, in a few words.

    The shape of the generalised Pareto distribution fitted to the largest weights (Vehtari et
    al., 2024): negative, a bounded tail (the best case); below 0.5, finite variance; 0.5 to 0.7,
    infinite variance that Pareto smoothing tames; above 0.7, unreliable.

    :param float khat: the shape; ``-inf`` (a degenerate fit to tied weights) counts as negative.
    :returns: a phrase such as ``"negative: the weights' tail is bounded, lighter than exponential;
        the best case, reliable"``.
    """
    khat = float(khat)
    if math.isnan(khat):
        raise ValueError("khat is NaN: the Pareto fit failed, nothing can be said about the weights")
    if khat < 0:
        return "negative: the weights' tail is bounded, lighter than exponential; the best case, reliable"
    if khat < 0.5:
        return "below 0.5: the weights have a finite variance; reliable"
    if khat <= KHAT_THRESHOLD:
        return (
            "between 0.5 and 0.7: the weights' variance is infinite, but Pareto smoothing makes the "
            "estimate reliable, with more Monte Carlo error"
        )
    return "above 0.7: the weights' tail is too heavy, the proposal misses posterior mass that matters; not reliable"


def psis(log_weights):
    r"""Pareto-smoothed, normalised log weights and :math:`\hat k` (ArviZ's ``psislw``, imported lazily)."""
    az = import_arviz()
    lw = np.asarray(log_weights, dtype=np.float64)
    lw = lw - lw.max()
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        smoothed, khat = az.psislw(lw)
    smoothed, khat = np.asarray(smoothed, dtype=np.float64), float(np.asarray(khat))
    if not (np.isfinite(khat) and np.isfinite(smoothed).all()):
        # The generalised Pareto fit degenerates when the largest weights are tied (few distinct
        # draws, e.g. small p): the tail is then bounded, k-hat is -inf, and no smoothing is needed.
        return lw - np.logaddexp.reduce(lw), -math.inf
    return smoothed, khat


def importance_check(
    x,
    y,
    proposals,
    prior_inclusion,
    slab_scale,
    noise_scale,
    mixture=None,
    num_draws=2000,
    generator=None,
    core=None,
    rao_blackwell=True,
    gram=None,
):
    r"""Reweight draws of a product-Bernoulli proposal (or a mixture of them) to the exact collapsed posterior.

    :param x: ``(n, p)`` tensor, centred.
    :param y: ``(n,)`` tensor, centred.
    :param proposals: ``(C, p)`` or ``(p,)`` tensor of inclusion probabilities in ``(0, 1)``, one
        row per mixture component (see :class:`BernoulliMixture` for the background features).
    :param mixture: ``(C,)`` mixture weights (default equal).
    :param float prior_inclusion: :math:`\pi_0` of the target model.
    :param float slab_scale: its :math:`\tau`.
    :param float noise_scale: its :math:`\sigma`.
    :param int num_draws: number of draws :math:`S`.
    :param generator: a :class:`torch.Generator` for the draws (on the device of ``x``).
    :param core: ``(p,)`` boolean mask of the features drawn one by one (see :class:`BernoulliMixture`).
    :param bool rao_blackwell: estimate each inclusion probability by the weighted mean of its conditional
        :math:`P(\gamma_j = 1 \mid \gamma_{-j}, y)` over the distinct drawn models (exact, from the Schur
        complements of :class:`~l0bayes.selection.sampler.state.ChainState`) instead of the weighted mean of the
        indicator :math:`\gamma_j`: the same limit, a smaller Monte Carlo error, and no exact zeros for the
        features no draw included (their order then says which come next).
    :param gram: :math:`X^\top X` (``(p, p)``) where the caller has it: the marginal likelihoods read it instead
        of computing products with ``X``, and so do the Rao-Blackwellised probabilities where the sampler's state
        would compute it (:func:`~l0bayes.selection.sampler.state.full_gram_pays`).
    :returns: :class:`ImportanceCheck`.
    """
    proposals = torch.as_tensor(proposals, dtype=x.dtype, device=x.device).reshape(-1, x.shape[1])
    num_components, p = proposals.shape
    if not bool(((proposals > 0) & (proposals < 1)).all()):
        raise ValueError("proposal probabilities must lie strictly inside (0, 1)")
    if mixture is None:
        mixture = torch.full((num_components,), 1.0 / num_components, dtype=x.dtype, device=x.device)
    law = BernoulliMixture(proposals, torch.as_tensor(mixture, dtype=x.dtype, device=x.device), core)
    index, log_q = law.sample(num_draws, generator)
    log_ml, coef = collapsed_log_marginal(x, y, index, slab_scale, noise_scale, core=law.core, gram=gram)
    size = (index < p).sum(1).to(x.dtype)
    log_prior = size * math.log(prior_inclusion) + (p - size) * math.log1p(-prior_inclusion)
    smoothed, khat = psis((log_ml + log_prior - log_q).cpu().numpy())
    weights = torch.as_tensor(np.exp(smoothed), dtype=x.dtype, device=x.device)
    flat = index.flatten()
    coef_mean = x.new_zeros(p + 1).index_add_(0, flat, (weights[:, None] * coef).flatten())[:p]
    draws = torch.zeros(num_draws, p + 1, dtype=torch.bool, device=x.device)
    draws[torch.arange(num_draws, device=x.device)[:, None], index] = True
    if rao_blackwell:
        hyper = (prior_inclusion, slab_scale, noise_scale)
        inclusion = conditional_inclusion(x, y, draws[:, :p], weights, *hyper, gram=gram)
    else:
        inclusion = x.new_zeros(p + 1).index_add_(0, flat, weights[:, None].expand_as(index).flatten())[:p]
        inclusion = inclusion.clamp(0.0, 1.0)  # a sum of normalised weights: above 1 only by rounding
    return ImportanceCheck(
        khat=khat,
        ess=float(1.0 / (weights**2).sum()),
        num_draws=num_draws,
        inclusion=inclusion.cpu().numpy(),
        coef_mean=coef_mean.cpu().numpy(),
        proposal=law.marginal.cpu().numpy(),
        draws=draws[:, :p].cpu().numpy(),
        log_weights=smoothed,
    )


def conditional_inclusion(x, y, draws, weights, prior_inclusion, slab_scale, noise_scale, batch=64, gram=None):
    r"""Rao-Blackwellised inclusion probabilities of weighted draws: :math:`\sum_s w_s P(\gamma_j = 1 \mid
    \gamma^{(s)}_{-j}, y) / \sum_s w_s`.

    Each distinct drawn model counts once with its summed weight; the conditionals come in batches from the
    sampler's rank-one state. The heaviest models holding all but :data:`RB_TAIL` of the weight (at most
    :data:`RB_MODELS` of them) are Rao-Blackwellised; the rest of the weight keeps its indicators.

    :param x: ``(n, p)`` tensor, centred; ``y`` ``(n,)``, centred.
    :param draws: ``(S, p)`` boolean tensor of drawn models.
    :param weights: ``(S,)`` their normalised importance weights.
    :param float prior_inclusion: :math:`\pi_0`; ``slab_scale`` :math:`\tau`; ``noise_scale`` :math:`\sigma`.
    :param int batch: models per batch of the sampler's state
        (:class:`~l0bayes.selection.sampler.state.ChainState`).
    :param gram: :math:`X^\top X` where the caller has it.
    :returns: ``(p,)`` tensor of probabilities in ``[0, 1]``.
    """
    models, inverse = torch.unique(draws, dim=0, return_inverse=True)
    mass = weights.new_zeros(models.shape[0]).index_add_(0, inverse, weights)
    order = torch.argsort(mass, descending=True)
    models, mass = models[order], mass[order]
    covered = torch.cumsum(mass, 0) / mass.sum()
    count = min(int((covered < 1.0 - RB_TAIL).sum()) + 1, RB_MODELS, models.shape[0])
    u = torch.cat([x.T @ y, y.new_zeros(1)])
    log_odds = math.log(prior_inclusion) - math.log1p(-prior_inclusion)
    total = (mass[count:, None] * models[count:].to(x.dtype)).sum(0)
    precision = x.new_full((1,), 1.0 / noise_scale**2)
    state = ChainState(x, u, 1.0 / slab_scale**2, 1.0, 0, precision, None, 16, gram=gram)  # one state, one Gram cache
    for start in range(0, count, batch):
        chunk = models[start : min(start + batch, count)]
        state.noise_precision = precision  # start() expands it to the batch
        state.start(chunk)
        logit, _ = state.conditionals(log_odds, 2.0 * math.log(slab_scale))
        total += (mass[start : start + chunk.shape[0], None] * torch.sigmoid(logit)).sum(0)
    # a weighted mean of probabilities: outside [0, 1] only by rounding (an ulp above 1 where every model is sure)
    return (total / mass.sum()).clamp(0.0, 1.0)


def gate_importance_check(model, x, y, prior_inclusion=None, slab_scale=None, noise_scale=None, num_draws=2000, seed=0):
    r"""Pareto :math:`\hat k` of a fitted :class:`~l0bayes.models.SparseLinearRegression`'s mean-field gates.

    The proposal is the guide itself: :math:`\gamma_j = [z_j \ne 0]`, independent across
    :math:`j` with probabilities :math:`q(z_j \ne 0)`. The target is the conjugate model with the
    fitted model's own prior (``model.prior_inclusion``, ``model.prior_scale``,
    ``model.noise_scale``) unless given. ``x`` and ``y`` must be centred as in the fit.
    :math:`\hat k > 0.7` says the mean-field probabilities are not to be trusted.
    """
    x = torch.as_tensor(x).to(torch.float64)
    y = torch.as_tensor(y).to(torch.float64)
    prior_inclusion = model.prior_inclusion if prior_inclusion is None else prior_inclusion
    slab_scale = model.prior_scale if slab_scale is None else slab_scale
    noise_scale = float(model.noise_scale) if noise_scale is None else noise_scale
    probs = model.inclusion_probabilities().to(torch.float64)
    tiny = torch.finfo(torch.float64).eps
    probs = probs.clamp(tiny, 1.0 - tiny)
    generator = torch.Generator().manual_seed(seed)
    return importance_check(
        x, y, probs, prior_inclusion, slab_scale, noise_scale, num_draws=num_draws, generator=generator
    )
