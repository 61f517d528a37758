r"""Exact inclusion probabilities by weighted tempered Gibbs sampling of the collapsed spike-and-slab posterior.

The sampler of Zanella & Roberts (2019, "Scalable importance tempering and Bayesian variable
selection", JRSS-B 81), *weighted tempered Gibbs sampling* (wTGS, their Section 4), on the
inclusion indicators :math:`\gamma \in \{0, 1\}^p` with the coefficients integrated out.

**Gaussian family.** The model of :mod:`l0bayes.analysis.exact` (centred data, known
:math:`\sigma`): :math:`\gamma_j \sim \mathrm{Bernoulli}(\pi_0)`, :math:`b_j \mid \gamma_j = 1
\sim N(0, \tau^2)`, :math:`y \sim N(X_\gamma b_\gamma, \sigma^2 I)`.

**Bernoulli family.** :math:`y_i \sim \mathrm{Bernoulli}(\mathrm{sigmoid}(\psi_i))`,
:math:`\psi = b_0 + X_\gamma b_\gamma`, :math:`b_0 \sim N(0, \tau_0^2)` always included. With
Pólya-Gamma variables :math:`\omega_i` (Polson, Scott & Windle, 2013;
:mod:`l0bayes.distributions.polya_gamma`) the likelihood is Gaussian in :math:`\psi`,
:math:`p(y \mid \psi, \omega) \propto \exp(\kappa^\top \psi - \tfrac12 \psi^\top \Omega \psi)`
with :math:`\kappa = y - \tfrac12`, so :math:`b` integrates out given :math:`\omega` as in the
Gaussian case. :math:`\omega` is one more coordinate of the tempered Gibbs sampler, updated
from its exact conditional (draw :math:`b \mid \gamma, \omega, y`, then
:math:`\omega_i \sim \mathrm{PG}(1, \psi_i)`; this kernel is reversible for
:math:`p(\omega \mid \gamma, y)`). For the Gaussian family with ``noise_prior="jeffreys"``,
:math:`\sigma^2` is such a coordinate too (draw :math:`b`, then :math:`\sigma^2` from its
inverse-gamma conditional).

**Both.** With precision weights :math:`W` (:math:`I/\sigma^2`, or :math:`\Omega`), working
response :math:`u = X^\top W y` (or :math:`X^\top \kappa`) and, for the current model,
:math:`A = X_\gamma^\top W X_\gamma + D^{-1}` (:math:`D` the prior variances),
:math:`\hat b = A^{-1} u_\gamma`, the conditional Bayes factor of feature :math:`j` against the
rest of :math:`\gamma` is, for :math:`j \notin \gamma`,

.. math::
    \log \mathrm{BF}_j = -\tfrac12 \log \tau^2 - \tfrac12 \log s_j + \frac{r_j^2}{2 s_j},\qquad
    s_j = x_j^\top W x_j + \tau^{-2} - g_j^\top A^{-1} g_j,\quad r_j = u_j - g_j^\top \hat b,

(:math:`g_j = X_\gamma^\top W x_j`, a Schur complement) and for :math:`j \in \gamma` the same
with :math:`s_j = 1 / (A^{-1})_{jj}` and :math:`r_j = s_j \hat b_j`. Then
:math:`\pi_j(\gamma) = P(\gamma_j = 1 \mid \gamma_{-j}, y) = \mathrm{sigmoid}(\log\mathrm{BF}_j
+ \mathrm{logit}\,\pi_0)`, for every :math:`j` at once in :math:`O(pk)` from
:math:`q_j = g_j^\top A^{-1} g_j`, which the sampler keeps current with rank-one updates of
:math:`A^{-1}` and :math:`q` when a feature enters or leaves (no refactorisation; a full
recomputation every ``refresh`` steps bounds the rounding drift).

One wTGS step at state :math:`\gamma` picks coordinate :math:`j` with probability proportional to

.. math::
    p_j(\gamma) = \frac{\pi_j(\gamma) + \kappa_e / p}{P(\gamma_j \mid \gamma_{-j}, y)}

(:math:`\kappa_e` = ``explore``) and flips it. The chain is reversible with respect to
:math:`p(\gamma \mid y)\, Z(\gamma)`, :math:`Z = \sum_j p_j`, so each state carries the
importance weight :math:`1/Z(\gamma)`, and the Rao-Blackwellised estimate is

.. math::
    \hat P(\gamma_j = 1 \mid y) = \frac{\sum_t \pi_j(\gamma^{(t)}) / Z(\gamma^{(t)})}{\sum_t 1 / Z(\gamma^{(t)})}.

The coordinates that matter are updated most often (:math:`p_j` is large where :math:`\pi_j` is),
and a flip between two correlated features, which a plain Gibbs sampler makes with tiny
probability, is taken at once: the tempering puts the weight on it, the importance weight
corrects for that. Several chains run in lock step (batched tensor operations, any device).

Monte Carlo error. Each chain's steps are summed in blocks; for feature :math:`j` the block
contributions :math:`v_{cb} = \sum_{t \in b} w_t (\pi_j(\gamma^{(t)}) - \hat P_j) / \bar w`
have mean zero, and the Monte Carlo standard error of :math:`\hat P_j` is ArviZ's standard error
of their mean (effective sample size from the autocorrelations of all chains). R-hat is ArviZ's
rank-normalised split :math:`\hat R` of the block sums :math:`\sum_{t \in b} w_t \pi_j / \bar w`
(equal across chains when they agree). The effective sample size reported per probability is
:math:`\hat P_j (1 - \hat P_j) / \mathrm{MCSE}_j^2`: the number of independent exact draws of
:math:`\gamma_j` that would estimate it as precisely.
"""

import math
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from ..distributions.polya_gamma import polya_gamma_mean, sample_polya_gamma
from .convergence import ess_mean, rank_rhat

RHAT_MAX = 1.01  # Vehtari, Gelman, Simpson, Carpenter & Bürkner (2021): R-hat below 1.01
ESS_MIN = 100  # and at least 100 effective draws for every probability that matters
RELEVANT = 0.01  # the probabilities that matter for the mixing verdict
# Gaussian: the whole Gram matrix X^T X is computed at the start when it has at most FULL_GRAM_MAX columns (128
# MiB in float64) and costs at most FULL_GRAM_FLOPS multiply-adds (about a second of one core); else its columns
# as the chains first need them
FULL_GRAM_MAX = 4096
FULL_GRAM_FLOPS = 2e10
MAX_BLOCKS = 256  # blocks kept per chain (pairs merge when full)
MAX_STATES = 1000  # thinned states kept per chain (at least this many, fewer than twice)
# noise_prior="jeffreys": a draw of sigma below this fraction of y's standard deviation means that the chain's model
# fits y exactly, where the posterior of sigma under p(sigma^2) = 1/sigma^2 is improper (it has no mass elsewhere)
NOISE_FLOOR = 1e-6


def check_gram(gram, x):
    r"""``gram`` (or ``None``), checked as :math:`X^\top X` of ``x``: ``(p, p)``, the dtype and device of ``x``."""
    if gram is None:
        return None
    p = x.shape[1]
    if not isinstance(gram, torch.Tensor) or gram.shape != (p, p) or gram.dtype != x.dtype or gram.device != x.device:
        got = f"{tuple(gram.shape)} {gram.dtype} on {gram.device}" if isinstance(gram, torch.Tensor) else type(gram)
        raise ValueError(f"gram must be X^T X: a ({p}, {p}) {x.dtype} tensor on {x.device}, got {got}")
    return gram


def full_gram_pays(n, p):
    r"""Whether the Gaussian sampler computes the whole Gram matrix :math:`X^\top X` of an ``(n, p)`` ``X`` at the
    start (:data:`FULL_GRAM_MAX`, :data:`FULL_GRAM_FLOPS`) instead of its columns as chains visit them."""
    return p <= FULL_GRAM_MAX and n * p**2 <= FULL_GRAM_FLOPS


@dataclass
class TemperedGibbsResult:
    r"""What :func:`tempered_gibbs` returns (numpy arrays over the ``p`` features).

    :ivar inclusion: Rao-Blackwellised :math:`\hat P(\gamma_j = 1 \mid y)`.
    :ivar mcse: Monte Carlo standard error of each (with :attr:`ess` and :attr:`rhat`, ``None`` after
        ``tempered_gibbs(diagnose=False)`` until :meth:`diagnose`).
    :ivar ess: effective sample size of each (:math:`\hat P (1 - \hat P) / \mathrm{MCSE}^2`).
    :ivar rhat: rank-normalised split R-hat across chains (``nan`` where every chain's estimate is
        below :data:`RELEVANT` / 10: not computed, nothing to compare).
    :ivar coef_mean: Rao-Blackwellised posterior mean of each coefficient.
    :ivar chain_inclusion: ``(chains, p)`` each chain's own estimate.
    :ivar states: ``(chains, draws)`` list of lists: thinned states as index arrays of the included features.
    :ivar state_log_weights: ``(chains, draws)`` their log importance weights :math:`-\log Z`.
    :ivar num_steps: steps per chain after warm-up.
    :ivar num_warmup: warm-up steps per chain.
    :ivar seconds: wall time.
    :ivar details: ``omega_fraction`` (share of steps that updated :math:`\omega` or :math:`\sigma`),
        ``stopped`` (``"mixed"``, ``"time"`` or ``"steps"``), ``noise_scale_mean`` (posterior mean
        of :math:`\sigma` when it is sampled).
    """

    inclusion: np.ndarray
    mcse: np.ndarray | None
    ess: np.ndarray | None
    rhat: np.ndarray | None
    coef_mean: np.ndarray
    chain_inclusion: np.ndarray
    states: list = field(repr=False)
    state_log_weights: np.ndarray = field(repr=False)
    num_steps: int = 0
    num_warmup: int = 0
    seconds: float = 0.0
    details: dict = field(default_factory=dict)
    _blocks: tuple = field(default=None, repr=False, compare=False)  # block sums until diagnose() (diagnose=False)

    def unmixed(self, rhat_max=RHAT_MAX, ess_min=ESS_MIN, relevant=RELEVANT):
        """Boolean ``(p,)``: probabilities at least ``relevant`` whose R-hat or ESS fails its threshold."""
        self.diagnose()
        matters = self.inclusion >= relevant
        bad_rhat = ~(self.rhat <= rhat_max)  # nan counts as bad where it matters
        return matters & (bad_rhat | ~(self.ess >= ess_min))

    def diagnose(self):
        """Compute :attr:`rhat`, :attr:`mcse` and :attr:`ess` where ``tempered_gibbs(diagnose=False)`` left them
        ``None`` (from the chains' block sums, kept for this); returns ``self``."""
        if self.rhat is None:
            if self._blocks is None:
                raise ValueError("no block sums kept to diagnose this result: rhat, mcse and ess were never computed")
            bh, bw, seen_at = self._blocks
            self.rhat, self.mcse, self.ess = _diagnostics(bh, bw, self.inclusion, seen_at)
            self._blocks = None  # (C, B, p): released once used
        return self

    @property
    def mixed(self):
        """``True`` when every probability of at least :data:`RELEVANT` has R-hat <= 1.01 and ESS >= 100."""
        return not bool(self.unmixed().any())

    def steps_to_mix(self, rhat_max=RHAT_MAX, ess_min=ESS_MIN, relevant=RELEVANT):
        r"""About how many steps per chain after warm-up would mix the probabilities that fail now.

        A chain's mean averages an effective number of draws that grows in proportion to its steps, and
        :math:`\hat R^2 - 1` is about the inverse of that number (the between-chain variance of the means over the
        within-chain variance), so :math:`\hat R^2 - 1` and :math:`1/\mathrm{ESS}` both fall as :math:`1/T`. The
        estimate scales :attr:`num_steps` by the larger of :math:`(\hat R^2 - 1) / (\hat R_{\max}^2 - 1)` and
        :math:`\mathrm{ESS}_{\min} / \mathrm{ESS}` over the failing probabilities. An extrapolation, not a promise:
        a chain that has not yet found a mode reads as mixing faster than it does.

        :returns: :attr:`num_steps` when every probability has mixed; ``None`` when a failing R-hat or ESS could not
            be computed (``nan``: too few draws) or no step was taken.
        """
        bad = self.unmixed(rhat_max, ess_min, relevant)
        if not bad.any():
            return self.num_steps
        rhat, ess = self.rhat[bad], self.ess[bad]
        if self.num_steps < 1 or not (np.isfinite(rhat).all() and np.isfinite(ess).all() and (ess > 0).all()):
            return None
        factor = max(float(np.max((rhat**2 - 1.0) / (rhat_max**2 - 1.0))), float(np.max(ess_min / ess)), 1.0)
        return math.ceil(self.num_steps * factor)


class _Blocks:
    """Block sums of one quantity per chain; when ``MAX_BLOCKS`` are full, neighbours merge (bounded memory)."""

    def __init__(self):
        self.sums = []  # list of (C, ...) tensors
        self.size = 1  # steps per stored block
        self.open = None
        self.count = 0
        self.total = 0.0

    def add(self, value):
        self.total = self.total + value.sum()
        self.open = value.clone() if self.open is None else self.open + value
        self.count += 1
        if self.count == self.size:
            self.sums.append(self.open)
            self.open, self.count = None, 0
            if len(self.sums) == MAX_BLOCKS:
                self.sums = [a + b for a, b in zip(self.sums[::2], self.sums[1::2], strict=True)]
                self.size *= 2

    def stacked(self):
        """``(C, B, ...)`` the completed blocks."""
        return torch.stack(self.sums, dim=1)


class _Snapshots:
    """Thinned states of every chain as index arrays of their included features, with their log weights.

    Every ``thin``-th state at first; the interval doubles whenever ``2 * MAX_STATES`` are kept, so 1000 to 2000
    remain per chain. States wait in a device buffer and are converted in batches of :attr:`BUFFER` (one
    transfer per batch, not one per state).
    """

    BUFFER = 64

    def __init__(self, chains, p, dtype, device, thin):
        self.thin = thin
        self.states, self.log_weights = [[] for _ in range(chains)], [[] for _ in range(chains)]
        self.gamma = torch.empty(chains, self.BUFFER, p, dtype=torch.bool, device=device)
        self.log_w = torch.empty(chains, self.BUFFER, dtype=dtype, device=device)
        self.count = 0

    def add(self, done, gamma, log_w):
        """Keep the chains' states ``gamma`` at post-warm-up step ``done`` if it is a multiple of the interval."""
        if done % self.thin:
            return
        self.gamma[:, self.count] = gamma
        self.log_w[:, self.count] = log_w
        self.count += 1
        if self.count == self.BUFFER:
            self.flush()

    def flush(self):
        if not self.count:
            return
        gamma = self.gamma[:, : self.count].cpu().numpy()
        log_w = self.log_w[:, : self.count].cpu().numpy()
        for c, (rows, weights) in enumerate(zip(gamma, log_w, strict=True)):
            self.states[c].extend(np.flatnonzero(row) for row in rows)
            self.log_weights[c].extend(weights.tolist())
        self.count = 0
        while len(self.states[0]) >= 2 * MAX_STATES:  # the kept states are consecutive multiples of thin
            self.states = [s[::2] for s in self.states]
            self.log_weights = [s[::2] for s in self.log_weights]
            self.thin *= 2


class _State:
    r"""Batched state of ``C`` chains: slots of included features, :math:`A^{-1}`, Gram columns and :math:`q`.

    ``xat`` is :math:`X_a^\top`, :math:`X_a` being ``X`` with the always-included columns appended and a zero
    column last (the index of an empty slot). ``omega`` is ``None`` for the Gaussian family (:math:`W =
    I/\sigma^2` per chain, Gram columns cached) or ``(C, n)`` Pólya-Gamma variables.
    """

    def __init__(self, x, u, slab_precision, fixed_precision, num_fixed, noise_precision, omega, capacity, gram=None):
        # u: (p + F + 1,) X_a^T y (Gaussian, scaled by each chain's 1 / sigma^2) or X_a^T kappa (Bernoulli)
        self.n, self.p = x.shape
        self.dtype, self.device = x.dtype, x.device
        self.num_fixed = num_fixed
        self.x = x.contiguous()
        # X_a^T: row j is column j of X, then the always-included columns, then the zero column (contiguous rows:
        # the columns of a model are gathered as rows)
        self.xat = torch.cat([x.T, x.new_ones(num_fixed, self.n), x.new_zeros(1, self.n)], dim=0)
        self.pad = self.p + num_fixed
        self.x2 = x * x
        self.x2_sum = self.x2.sum(0)
        self.u0 = u  # zero at the pad; self.u: (C, p + F + 1) each chain's working response
        self.lam = slab_precision
        self.fixed_lam = fixed_precision
        self.noise_precision = noise_precision  # Gaussian: (C,) 1 / sigma^2 of each chain; None for PG weights
        self.omega = omega  # (C, n) or None
        self.yy = None  # Gaussian: y^T y, kept at its first use
        self.cache_index = torch.full((self.pad + 1,), -1, dtype=torch.long, device=self.device)
        self.cache = x.new_zeros(0, self.p)  # row i: x_j^T X of the i-th cached feature j (cache_index[j] = i)
        self.cached = 0
        self.capacity = capacity
        self.full_gram = omega is None and full_gram_pays(self.n, self.p)
        if self.full_gram:
            # the whole Gram matrix in one product: cheaper than the many small ones of a chain that roams
            self.cache = x.T @ x if gram is None else gram
            self.cache_index[: self.p] = torch.arange(self.p, device=self.device)
            self.cached = self.p

    # -- Gram columns X^T W x_j, stored and returned as rows (a row is contiguous)
    def gram_columns(self, chains, cols):
        r"""``(len(chains), p)``: :math:`x_j^\top W_c X` for each pair (chain, column ``j``).

        The products are taken as ``(k, n) @ (n, p)``: with few columns ``k`` (a model's features) this order
        runs 3-5x faster on the CPU than the transposed one (one thread, float64, ``n = 500``, ``p = 1000``,
        ``k = 15``: 0.85 ms against 4.1 ms).
        """
        if self.full_gram:  # symmetric: row j is column j
            return self.cache[cols] * self.noise_precision[chains, None]
        if self.omega is None:
            where = self.cache_index[cols]
            if bool((where < 0).any()):
                missing = torch.unique(cols[where < 0])
                start, end = self.cached, self.cached + missing.numel()
                if end > self.cache.shape[0]:  # grow the cache by doubling
                    grown = self.cache.new_zeros(max(2 * self.cache.shape[0], end, 64), self.p)
                    grown[:start] = self.cache[:start]
                    self.cache = grown
                self.cache[start:end] = self.xat[missing] @ self.x
                self.cache_index[missing] = torch.arange(start, end, device=self.device)
                self.cached = end
                where = self.cache_index[cols]
            return self.cache[where] * self.noise_precision[chains, None]
        weighted = self.omega[chains] * self.xat[cols]  # (m, n)
        return weighted @ self.x

    def diag(self):
        r"""``(C, p)`` or ``(1, p)``: :math:`x_j^\top W x_j`."""
        if self.omega is None:
            return self.x2_sum[None] * self.noise_precision[:, None]
        return self.omega @ self.x2

    def slots(self, c):
        """The used slots of chain ``c`` and their features, in slot order."""
        idx = self.idx[c]
        pos = torch.nonzero(idx != self.pad).flatten()
        return pos, idx[pos]

    def prior_precision(self, pos):
        r"""The prior precisions of slots ``pos``: :math:`1/\tau^2`, the always-included slots' own first."""
        out = torch.full(pos.shape, self.lam, dtype=self.dtype, device=self.device)
        if self.num_fixed:
            out[pos < self.num_fixed] = self.fixed_lam
        return out

    def start(self, gammas):
        """Set every chain to the models of ``gammas`` (``(C, p)`` bool)."""
        self.C = gammas.shape[0]
        sizes = gammas.sum(1)
        self.capacity = max(self.capacity, int(sizes.max()) + self.num_fixed + 4)
        self.idx = torch.full((self.C, self.capacity), self.pad, dtype=torch.long, device=self.device)
        for f in range(self.num_fixed):
            self.idx[:, f] = self.p + f
        for c in range(self.C):
            on = torch.nonzero(gammas[c]).flatten()
            self.idx[c, self.num_fixed : self.num_fixed + on.numel()] = on
        self.gamma = gammas.clone()
        self.arange = torch.arange(self.C, device=self.device)
        if self.omega is None:
            self.noise_precision = self.noise_precision.expand(self.C).clone()
            self.u = self.u0[None] * self.noise_precision[:, None]
        else:
            self.u = self.u0.expand(self.C, -1).clone()
        self.allocate()
        self.d = self.diag()
        self.refresh(torch.arange(self.C, device=self.device))

    def refresh(self, chains):
        """Recompute the Gram rows ``Gt``, :math:`A^{-1}` and :math:`q` of ``chains`` from scratch."""
        cached = self.omega is None and self.num_fixed == 0  # Gaussian: Gram columns from the cache, O(pk)
        for c in chains.tolist():
            pos, cols = self.slots(c)
            if cached:
                gram = self.gram_columns(torch.full_like(cols, c), cols)  # (k, p): x_j^T W X
                a_used = gram[:, cols]
            else:
                xs = self.xat[cols]  # (k, n)
                wxs = xs * (self.noise_precision[c] if self.omega is None else self.omega[c])
                a_used = wxs @ xs.T
                gram = wxs @ self.x
            a_used = a_used + torch.diag(self.prior_precision(pos))
            inv = torch.cholesky_inverse(torch.linalg.cholesky(a_used))
            self.ainv[c].zero_()  # the empty slots' rows and columns are zero
            self.ainv[c, pos[:, None], pos[None, :]] = inv
            self.Gt[c].zero_()
            self.Gt[c, pos] = gram
            self.q[c] = ((inv @ gram) * gram).sum(0)  # over the used slots only: the others are zero
            self.d[c] = self.x2_sum * self.noise_precision[c] if self.omega is None else self.omega[c] @ self.x2

    def allocate(self):
        C, K = self.C, self.capacity
        self.ainv = self.x.new_zeros(C, K, K)
        self.Gt = self.x.new_zeros(C, K, self.p)  # slot k's Gram column x_k^T W X, a contiguous row
        self.q = self.x.new_zeros(C, self.p)

    def grow(self):
        """Double the slot capacity (a chain's model outgrew it)."""
        K, extra = self.capacity, self.capacity
        self.capacity = 2 * K
        self.idx = torch.cat([self.idx, self.idx.new_full((self.C, extra), self.pad)], dim=1)
        self.ainv = torch.nn.functional.pad(self.ainv, (0, extra, 0, extra))
        self.Gt = torch.nn.functional.pad(self.Gt, (0, 0, 0, extra))

    def conditionals(self, log_prior_odds, log_slab_var):
        r"""``logit`` :math:`\pi_j(\gamma)` and :math:`E[b_j \mid \gamma_j = 1, \gamma_{-j}, y]`, ``(C, p)`` each."""
        u_slot = self.u.gather(1, self.idx)  # (C, K)
        beta = torch.bmm(self.ainv, u_slot[..., None]).squeeze(-1)  # (C, K)
        r = self.u[:, : self.p] - torch.bmm(beta[:, None, :], self.Gt).squeeze(1)  # (C, p)
        s = torch.clamp(self.d + self.lam - self.q, min=self.lam)  # s_j >= 1/tau^2 exactly; guards rounding
        # features in the model: s = 1 / Ainv_kk and r / s = b_hat_k, written over the slots
        # (empty slots write to a spare column p, dropped)
        slots = self.idx[:, self.num_fixed :].clamp(max=self.p)
        a_kk = torch.diagonal(self.ainv, dim1=-2, dim2=-1)[:, self.num_fixed :]
        b_k = beta[:, self.num_fixed :]
        spare = s.new_ones(self.C, 1)
        mean = torch.cat([r / s, spare], 1).scatter_(1, slots, b_k)
        inv_s = torch.cat([1.0 / s, spare], 1).scatter_(1, slots, a_kk)
        mean, inv_s = mean[:, : self.p], inv_s[:, : self.p]
        logit = 0.5 * (torch.log(inv_s) + mean * mean / inv_s - log_slab_var) + log_prior_odds
        return logit, mean

    def flip(self, feats, act):
        """Flip feature ``feats[c]`` in each chain ``c`` with ``act[c]``: rank-one updates of A^-1, ``Gt`` and q."""
        ar = self.arange
        was_on = self.gamma.gather(1, feats[:, None]).squeeze(1)
        adding, removing = act & ~was_on, act & was_on
        free = self.idx == self.pad
        if bool((adding & ~free.any(1)).any()):
            self.grow()
            free = self.idx == self.pad
        K = self.capacity
        free_slot = torch.argmax(free.to(torch.int8), dim=1)
        on_slot = torch.argmax((self.idx == feats[:, None]).to(torch.int8), dim=1)
        slot = torch.where(adding, free_slot, on_slot)
        # adding j: b = Gram(j, slots) = row j of G; u = Ainv b; s = d_j + lam - b.u; v = u - e_slot, coef 1/s
        bvec = self.Gt.gather(2, feats[:, None, None].expand(-1, K, 1)).squeeze(-1)  # (C, K)
        uvec = torch.bmm(self.ainv, bvec[..., None]).squeeze(-1)
        d = self.d.expand(self.C, -1).gather(1, feats[:, None]).squeeze(1)
        s_add = d + self.lam - (bvec * uvec).sum(1)
        e = torch.nn.functional.one_hot(slot, K).to(self.dtype)
        # removing: v = Ainv[:, slot], coef -1 / Ainv[slot, slot]
        v_rem = torch.gather(self.ainv, 2, slot[:, None, None].expand(-1, K, 1)).squeeze(-1)
        a_ss = v_rem.gather(1, slot[:, None]).squeeze(1)
        v = torch.where(adding[:, None], uvec - e, v_rem)
        zero = torch.zeros_like(s_add)
        coef = torch.where(adding, 1.0 / s_add, torch.where(removing, -1.0 / a_ss, zero))
        if bool(adding.any()):
            chains, cols = ar[adding], feats[adding]
            self.Gt[chains, slot[adding]] = self.gram_columns(chains, cols)
        t = torch.bmm(v[:, None, :], self.Gt).squeeze(1)  # (C, p)
        self.q.addcmul_(coef[:, None] * t, t)
        self.ainv.baddbmm_(coef[:, None, None] * v[:, :, None], v[:, None, :])
        if bool(removing.any()):
            keep = 1.0 - e * removing[:, None].to(self.dtype)
            self.ainv.mul_(keep[:, :, None] * keep[:, None, :])
            chains, gone = ar[removing], slot[removing]
            self.Gt[chains, gone] = 0.0
        old_idx = self.idx.gather(1, slot[:, None]).squeeze(1)
        new_idx = torch.where(adding, feats, torch.where(removing, torch.full_like(feats, self.pad), old_idx))
        self.idx.scatter_(1, slot[:, None], new_idx[:, None])
        self.gamma.scatter_(1, feats[:, None], (act ^ was_on)[:, None])

    def _draw_slab(self, c, generator):
        r"""Draw :math:`b_{\gamma} \mid \gamma, \omega, y` for chain ``c``: ``(cols, b, gram)``, ``gram`` the cached
        :math:`X_\gamma^\top X_\gamma` (whole Gram matrix, Gaussian) or ``None`` (then :math:`A` comes from ``X``)."""
        pos, cols = self.slots(c)
        if self.full_gram:
            gram = self.cache[cols[:, None], cols]
            a = self.noise_precision[c] * gram
        else:
            gram, xs = None, self.xat[cols]
            w = self.noise_precision[c] if self.omega is None else self.omega[c]
            a = (xs * w) @ xs.T
        a.diagonal().add_(self.prior_precision(pos))
        chol = torch.linalg.cholesky(a)
        mean = torch.cholesky_solve(self.u[c, cols][:, None], chol).squeeze(-1)
        eps = torch.randn(mean.shape, dtype=self.dtype, device=self.device, generator=generator)
        b = mean + torch.linalg.solve_triangular(chol.T, eps[:, None], upper=True).squeeze(-1)
        return cols, b, gram

    def draw_coefficients(self, c, generator):
        r"""Draw :math:`b_{\gamma} \mid \gamma, \omega, y` for chain ``c``; return :math:`\psi = X_\gamma b_\gamma`."""
        cols, b, _ = self._draw_slab(c, generator)
        return b @ self.xat[cols]

    def residual_sum_of_squares(self, c, y, generator):
        r"""Gaussian: draw :math:`b_\gamma \mid \gamma, \sigma, y` for chain ``c``; return
        :math:`\lVert y - X_\gamma b_\gamma \rVert^2`.

        With the whole Gram matrix cached, :math:`\lVert y \rVert^2 - 2 b^\top X_\gamma^\top y + b^\top X_\gamma^\top
        X_\gamma b` costs :math:`O(k^2)` instead of :math:`O(nk)`. Where that sum loses more than half its digits to
        cancellation (a model that leaves almost nothing of ``y``) it is recomputed from the residual itself.
        """
        cols, b, gram = self._draw_slab(c, generator)
        if gram is None:
            return ((y - b @ self.xat[cols]) ** 2).sum()
        if self.yy is None:  # y is the same for the state's lifetime
            self.yy = (y * y).sum()
        rss = self.yy - 2.0 * (b * self.u0[cols]).sum() + b @ (gram @ b)
        if rss <= torch.finfo(self.dtype).eps ** 0.5 * self.yy:
            rss = ((y - b @ self.xat[cols]) ** 2).sum()
        return rss

    def set_noise_precision(self, c, precision):
        r"""Gaussian: chain ``c`` continues at noise precision :math:`1/\sigma^2` = ``precision``.

        Its working response, Gram rows, :math:`A^{-1}` and :math:`q` are recomputed (:meth:`refresh`): with the
        whole Gram matrix cached that reads the model's rows of it, :math:`O(pk)`, no product with ``X``.
        """
        self.noise_precision[c] = precision
        self.u[c] = self.u0 * precision
        self.refresh(torch.tensor([c], device=self.device))


def _polya_gamma_sampler(backend, device):
    r"""The function drawing :math:`\mathrm{PG}(1, \psi)`: the ``polyagamma`` package (compiled, CPU) or torch's."""
    if backend not in ("auto", "torch", "polyagamma"):
        raise ValueError(f"polya_gamma must be 'auto', 'torch' or 'polyagamma', got {backend!r}")
    if backend == "torch" or (backend == "auto" and torch.device(device).type != "cpu"):
        return sample_polya_gamma
    try:
        from polyagamma import random_polyagamma
    except ImportError:
        if backend == "polyagamma":
            raise ImportError("polya_gamma='polyagamma' needs the polyagamma package: pip install polyagamma") from None
        return sample_polya_gamma

    def draw(psi, generator=None):
        seed = int(torch.randint(2**62, (1,), generator=generator, device=psi.device))
        out = random_polyagamma(1, psi.detach().cpu().numpy(), random_state=np.random.default_rng(seed))
        return torch.as_tensor(out, dtype=psi.dtype, device=psi.device)

    return draw


def _rhat_ess(blocks_h, blocks_w, pip, select):
    """Rank R-hat and the MCSE of the ratio estimate for the features in ``select`` (block sums in), as ArviZ
    computes them, for all the features at once (:mod:`l0bayes.inference.convergence`)."""
    wbar = blocks_w.mean()
    h = blocks_h[:, :, select] / wbar  # (C, B, k)
    v = (blocks_h[:, :, select] - pip[select][None, None] * blocks_w[:, :, None]) / wbar
    rhat = rank_rhat(h)
    ess = ess_mean(v)
    # standard error of the mean of v per block, over the total number of blocks
    num = h.shape[0] * h.shape[1]
    sd = v.reshape(num, -1).std(0, ddof=1)
    mcse = sd / np.sqrt(np.maximum(ess, 1.0))
    return rhat, mcse


def _diagnostics(bh, bw, pip, seen_at):
    """R-hat, MCSE and ESS per feature from the block sums of the chains (``bh``: ``(C, B, p)``, ``bw``: ``(C, B)``).

    ArviZ computes R-hat and the MCSE of the features that some chain puts at ``seen_at`` or
    above; for the others (every chain says almost 0) the MCSE is the standard error of the
    chains' own estimates and R-hat is ``nan``.
    """
    p = pip.shape[0]
    rhat = np.full(p, np.nan)
    mcse = np.zeros(p)
    chain_pip = bh.sum(1) / bw.sum(1)[:, None]
    seen = chain_pip.max(0) >= seen_at
    if bh.shape[1] >= 4:
        sel = np.flatnonzero(seen)
        if sel.size:
            r, m = _rhat_ess(bh, bw, pip, sel)
            rhat[sel], mcse[sel] = r, m
        rest = np.flatnonzero(~seen)
        if rest.size:
            # tiny probabilities: the standard error of the chain means (between-chain spread)
            spread = chain_pip[:, rest].std(0, ddof=1) if bh.shape[0] > 1 else chain_pip[0, rest]
            mcse[rest] = spread / math.sqrt(bh.shape[0])
    else:
        mcse[:] = np.nan
    with np.errstate(divide="ignore", invalid="ignore"):
        ess = np.where(mcse == 0, np.inf, pip * (1 - pip) / mcse**2)
    return rhat, mcse, ess


def tempered_gibbs(
    x,
    y,
    prior_inclusion,
    slab_scale,
    noise_scale=None,
    family="gaussian",
    start=None,
    num_chains=4,
    warmup=500,
    max_steps=100_000,
    min_steps=1000,
    time_budget=None,
    check_every=1000,
    explore=5.0,
    kernel="wtgs",
    omega_fraction=0.2,
    noise_prior=None,
    intercept_scale=10.0,
    refresh=200,
    thin=None,
    polya_gamma="auto",
    generator=None,
    gram=None,
    diagnose=True,
):
    r"""Sample the collapsed spike-and-slab posterior with weighted tempered Gibbs (see the module docstring).

    :param x: ``(n, p)`` tensor (centred for the Gaussian family; the Bernoulli model has an intercept).
    :param y: ``(n,)`` tensor: centred response, or 0/1 labels for ``family="bernoulli"``.
    :param float prior_inclusion: :math:`\pi_0`.
    :param float slab_scale: :math:`\tau`.
    :param noise_scale: :math:`\sigma` (Gaussian family).
    :param start: ``(C, p)`` boolean starting models, or ``(p,)`` probabilities to draw them from
        (chain 0 starts at the median model), default the empty model.
    :param int num_chains: chains run in lock step.
    :param int warmup: steps per chain discarded first.
    :param int max_steps: at most this many steps per chain after warm-up.
    :param int min_steps: at least this many steps per chain after warm-up before stopping early.
    :param time_budget: seconds; sampling stops when they have passed (``None``: no limit).
    :param int check_every: steps between convergence checks; sampling stops early when every
        probability of at least 0.01 has R-hat <= 1.01 and ESS >= 100.
    :param float explore: :math:`\kappa_e` of the selection weights (about that many
        uniformly chosen coordinates per ``p`` steps).
    :param str kernel: ``"wtgs"`` or ``"gibbs"`` (random-scan Gibbs on the same conditionals,
        unweighted; for comparison).
    :param float omega_fraction: target share of steps that update :math:`\omega` (or :math:`\sigma`)
        (its selection weight :math:`\xi` is adapted during warm-up, then fixed).
    :param noise_prior: Gaussian: ``None`` keeps :math:`\sigma` = ``noise_scale`` fixed;
        ``"jeffreys"`` samples it too, under :math:`p(\sigma^2) \propto 1/\sigma^2`, from
        ``noise_scale``: one more coordinate like :math:`\omega` (draw :math:`b \mid \gamma,
        \sigma, y`, then :math:`\sigma^2 \sim \mathrm{InvGamma}(n/2, \lVert y - X_\gamma b
        \rVert^2 / 2)`); ``details["noise_scale_mean"]`` is its posterior mean.
    :param float intercept_scale: Bernoulli: prior sd :math:`\tau_0` of the intercept.
    :param int refresh: steps between full recomputations of :math:`A^{-1}` and :math:`q`.
    :param str polya_gamma: Bernoulli: how to draw :math:`\omega`: ``"torch"``
        (:func:`~l0bayes.distributions.polya_gamma.sample_polya_gamma`, any device),
        ``"polyagamma"`` (the compiled ``polyagamma`` package, CPU, a dependency of l0bayes)
        or ``"auto"`` (the package on the CPU where it is installed, else torch). Both are exact.
    :param thin: keep every ``thin``-th state for :attr:`TemperedGibbsResult.states` at first; the
        interval doubles whenever 2000 are kept, so 1000 to 2000 remain per chain.
    :param gram: Gaussian: :math:`X^\top X` (``(p, p)``) where the caller already has it; used where the
        sampler would compute it (:func:`full_gram_pays`), ignored otherwise.
    :param bool diagnose: compute R-hat, ESS and the MCSE of each probability at the end; ``False`` leaves them
        ``None`` until :meth:`TemperedGibbsResult.diagnose` is called (a short run read for its probabilities).
    :returns: :class:`TemperedGibbsResult`.
    """
    if family not in ("gaussian", "bernoulli"):
        raise ValueError(f"family must be 'gaussian' or 'bernoulli', got {family!r}")
    if kernel not in ("wtgs", "gibbs"):
        raise ValueError(f"kernel must be 'wtgs' or 'gibbs', got {kernel!r}")
    if not 0.0 < prior_inclusion < 1.0:
        raise ValueError(f"prior_inclusion must lie in (0, 1), got {prior_inclusion}")
    if not slab_scale > 0:
        raise ValueError(f"slab_scale must be positive, got {slab_scale}")
    if family == "gaussian" and not (noise_scale is not None and noise_scale > 0):
        raise ValueError(f"the Gaussian family needs a positive noise_scale, got {noise_scale}")
    if num_chains < 1 or warmup < 0 or min_steps < 0 or max_steps < 1 or check_every < 1:
        raise ValueError(
            "need num_chains >= 1, warmup >= 0, min_steps >= 0, max_steps >= 1 and check_every >= 1; got "
            f"{num_chains}, {warmup}, {min_steps}, {max_steps}, {check_every}"
        )
    began = time.perf_counter()
    n, p = x.shape
    dtype, device = x.dtype, x.device
    C = int(num_chains)
    gen = generator
    bern = family == "bernoulli"
    if bern:
        draw_pg = _polya_gamma_sampler(polya_gamma, device)
        kappa = y - 0.5
        u = torch.cat([x.T @ kappa, kappa.sum()[None], kappa.new_zeros(1)])
        omega = polya_gamma_mean(torch.zeros(C, n, dtype=dtype, device=device))
        state = _State(x, u, 1.0 / slab_scale**2, 1.0 / intercept_scale**2, 1, None, omega, 16)
    else:
        prec = torch.full((C,), 1.0 / noise_scale**2, dtype=dtype, device=device)
        u = torch.cat([x.T @ y, y.new_zeros(1)])
        state = _State(x, u, 1.0 / slab_scale**2, 1.0, 0, prec, None, 16, gram=check_gram(gram, x))
    if noise_prior not in (None, "jeffreys") or (noise_prior and bern):
        raise ValueError(f"noise_prior must be None or 'jeffreys' (Gaussian family), got {noise_prior!r}")
    aux = bern or noise_prior == "jeffreys"  # one more coordinate: omega, or sigma^2
    if noise_prior == "jeffreys":
        noise_floor = NOISE_FLOOR * math.sqrt(float(y @ y) / max(n - 1, 1))
        max_precision = 1.0 / noise_floor**2
    state.start(_starting_models(start, C, p, device, gen))
    if bern:  # start omega at a draw given the starting model's coefficients
        for c in range(C):
            state.omega[c] = draw_pg(state.draw_coefficients(c, gen), gen)
        state.refresh(torch.arange(C, device=device))
    log_odds = math.log(prior_inclusion) - math.log1p(-prior_inclusion)
    log_slab_var = 2.0 * math.log(slab_scale)
    log_explore = math.log(explore / p)
    if aux and not 0.0 < omega_fraction < 1.0:
        raise ValueError(f"omega_fraction must lie in (0, 1), got {omega_fraction}")
    # Z is about explore + |gamma| at a typical state: start xi near its target share of that
    log_xi = math.log(omega_fraction / (1.0 - omega_fraction) * (explore + 10.0)) if aux else -math.inf
    sigma_sum = x.new_zeros(())
    xi_trace = []
    chains = torch.arange(C, device=device)
    acc = {"pip": _Blocks(), "w": _Blocks(), "coef": _Blocks()}
    snapshots = _Snapshots(C, p, dtype, device, thin or 1)
    omega_moves, step, stopped = 0, 0, "steps"
    total = warmup + max_steps
    while step < total:
        logit, mean = state.conditionals(log_odds, log_slab_var)
        log_pi, log_not = torch.nn.functional.logsigmoid(logit), torch.nn.functional.logsigmoid(-logit)
        if kernel == "wtgs":
            log_eta = torch.logaddexp(log_pi, torch.full_like(log_pi, log_explore))
            log_sel = log_eta - torch.where(state.gamma, log_pi, log_not)
        else:
            log_sel = torch.zeros_like(log_pi)
        if aux:
            log_sel = torch.cat([log_sel, log_sel.new_full((C, 1), log_xi)], dim=1)
        log_z = torch.logsumexp(log_sel, dim=1)
        if step >= warmup:
            w = torch.exp(-log_z) if kernel == "wtgs" else torch.ones_like(log_z)
            pi = torch.exp(log_pi)
            acc["pip"].add(w[:, None] * pi)
            acc["w"].add(w)
            acc["coef"].add(w[:, None] * pi * mean)
            if noise_prior is not None:
                sigma_sum = sigma_sum + (w * state.noise_precision.rsqrt()).sum()
            snapshots.add(step - warmup, state.gamma, -log_z)
        cdf = torch.cumsum(torch.exp(log_sel - log_z[:, None]), dim=1)
        draw = torch.rand(C, 1, dtype=dtype, device=device, generator=gen) * cdf[:, -1:]
        choice = torch.searchsorted(cdf, draw).squeeze(1).clamp(max=cdf.shape[1] - 1)
        flips = choice < p
        if kernel == "gibbs":  # random scan: resample the chosen coordinate from its conditional
            j = choice.clamp(max=p - 1)
            new = torch.rand(C, dtype=dtype, device=device, generator=gen) < torch.exp(log_pi[chains, j])
            flips = flips & (new != state.gamma[chains, j])
        state.flip(choice.clamp(max=p - 1), flips)
        if aux:
            moves = torch.nonzero(choice == p).flatten()
            for c in moves.tolist():
                if bern:
                    state.omega[c] = draw_pg(state.draw_coefficients(c, gen), gen)
                else:  # sigma^2 | b, y ~ InvGamma(n / 2, RSS / 2) under p(sigma^2) = 1 / sigma^2: chi2_n / RSS
                    rss = state.residual_sum_of_squares(c, y, gen)
                    chi2 = torch.randn(n, dtype=dtype, device=device, generator=gen).pow(2).sum()
                    if not chi2 / rss <= max_precision:
                        raise ValueError(_collapsed(state.slots(c)[1], n, noise_floor))
                    state.set_noise_precision(c, chi2 / rss)
            if bern and moves.numel():
                state.refresh(moves)
            if step < warmup:  # Robbins-Monro on log xi towards the target share, averaged over the second half
                share = moves.numel() / C
                log_xi -= (share - omega_fraction) * 2.0 / math.sqrt(1.0 + step)
                if 2 * step + 1 >= warmup:  # the second half (at least the last step)
                    xi_trace.append(log_xi)
                if step == warmup - 1:
                    log_xi = sum(xi_trace) / len(xi_trace)
            else:
                omega_moves += moves.numel()
        step += 1
        if step % refresh == 0 and step < total:  # (none after the last step: nothing reads it)
            state.refresh(chains)
        done = step - warmup
        if time_budget is not None and time.perf_counter() - began >= time_budget and done > 0:
            stopped = "time"
            break
        if done >= min_steps and done > 0 and done % check_every == 0:
            if _result(acc, snapshots, done, warmup, began, omega_moves, C, RELEVANT).mixed:
                stopped = "mixed"
                break
    result = _result(acc, snapshots, max(step - warmup, 0), warmup, began, omega_moves, C, RELEVANT / 10, diagnose)
    result.details["stopped"] = stopped
    if noise_prior is not None:
        result.details["noise_scale_mean"] = float(sigma_sum / acc["w"].total)
    result.seconds = time.perf_counter() - began
    return result


def _collapsed(features, n, noise_floor):
    """The message of a chain whose noise scale collapsed: its model fits ``y`` exactly."""
    return (
        f"the noise scale sigma collapsed below {noise_floor:.3g} ({NOISE_FLOOR:g} x the standard deviation of y): "
        f"the model of features {sorted(features.tolist())} fits the {n} observations of y exactly, where the "
        "posterior of sigma under the Jeffreys prior is improper (with n observations, models of n - 1 features "
        "fit any centred y). Fix the noise scale: select_variables(..., noise_scale=...) or "
        "tempered_gibbs(..., noise_prior=None)"
    )


def _starting_models(start, C, p, device, gen):
    if start is None:
        return torch.zeros(C, p, dtype=torch.bool, device=device)
    start = torch.as_tensor(start, device=device)
    if start.dtype == torch.bool:
        if start.shape != (C, p):
            raise ValueError(f"start must have shape ({C}, {p}) when boolean, got {tuple(start.shape)}")
        return start
    probs = start.to(torch.float64).clamp(0.0, 1.0)
    draws = torch.rand(C, p, dtype=torch.float64, device=device, generator=gen) < probs
    draws[0] = probs > 0.5
    return draws


def _result(acc, snapshots, done, warmup, began, omega_moves, C, seen_at, diagnose=True):
    snapshots.flush()
    if not acc["w"].sums:  # fewer steps than one block: close the open one
        for a in acc.values():
            if a.open is not None:
                a.sums.append(a.open)
                a.open, a.count = None, 0
    total_w = acc["w"].stacked().sum()
    pip = (acc["pip"].stacked().sum((0, 1)) / total_w).cpu().numpy()
    coef = (acc["coef"].stacked().sum((0, 1)) / total_w).cpu().numpy()
    pip = np.clip(pip, 0.0, 1.0)
    bh, bw = acc["pip"].stacked().cpu().numpy(), acc["w"].stacked().cpu().numpy()  # (C, B, p), (C, B)
    result = TemperedGibbsResult(
        inclusion=pip,
        mcse=None,
        ess=None,
        rhat=None,
        coef_mean=coef,
        chain_inclusion=bh.sum(1) / bw.sum(1)[:, None],
        states=snapshots.states,
        state_log_weights=np.asarray(snapshots.log_weights, dtype=np.float64),
        num_steps=done,
        num_warmup=warmup,
        seconds=time.perf_counter() - began,
        details={"omega_fraction": omega_moves / max(done * C, 1)},
    )
    result._blocks = (bh, bw, seen_at)
    return result.diagnose() if diagnose else result  # diagnose() releases the block sums
