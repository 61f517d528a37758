r"""The batched state of the chains of :func:`~l0bayes.selection.sampler.gibbs.tempered_gibbs`.

For ``C`` chains, each at a model :math:`\gamma`, :class:`ChainState` keeps the slots of the included features,
:math:`A^{-1}` (:math:`A = X_\gamma^\top W X_\gamma + D^{-1}`), the Gram rows :math:`X_\gamma^\top W X` and
:math:`q_j = g_j^\top A^{-1} g_j`, from which :meth:`ChainState.conditionals` gives every feature's conditional
inclusion probability :math:`\pi_j(\gamma)` in :math:`O(pk)` (the formulas are in the docstring of
:mod:`l0bayes.selection.sampler.gibbs`). A flip updates them by rank one; :meth:`ChainState.refresh` recomputes
them. The importance check's Rao-Blackwellised probabilities use the same state
(:func:`~l0bayes.selection.importance.conditional_inclusion`).
"""

import torch

# Gaussian: the whole Gram matrix X^T X is computed at the start when it has at most FULL_GRAM_MAX columns (128
# MiB in float64) and costs at most FULL_GRAM_FLOPS multiply-adds (about a second of one core); else its columns
# as the chains first need them
FULL_GRAM_MAX = 4096
FULL_GRAM_FLOPS = 2e10


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


class ChainState:
    r"""Batched state of ``C`` chains: slots of included features, :math:`A^{-1}`, Gram columns and :math:`q`.

    ``xat`` is :math:`X_a^\top`, :math:`X_a` being ``X`` with the always-included columns appended and a zero
    column last (the index of an empty slot). ``omega`` is ``None`` for the Gaussian family (:math:`W =
    I/\sigma^2` per chain, Gram columns cached) or ``(C, n)`` Pólya-Gamma variables.

    :param x: ``(n, p)`` tensor.
    :param u: ``(p + F + 1,)`` :math:`X_a^\top y` (Gaussian, before the chains' :math:`1/\sigma^2`) or
        :math:`X_a^\top \kappa` (Bernoulli), zero in the last entry.
    :param float slab_precision: :math:`1/\tau^2`.
    :param float fixed_precision: the prior precision of the always-included columns (the intercept's).
    :param int num_fixed: ``F``, the always-included columns (of ones).
    :param noise_precision: Gaussian: ``(C,)`` or ``(1,)`` tensor of :math:`1/\sigma^2`; ``None`` with ``omega``.
    :param omega: ``(C, n)`` Pólya-Gamma variables (Bernoulli), else ``None``.
    :param int capacity: slots per chain to start with (doubled when a model outgrows them).
    :param gram: Gaussian: :math:`X^\top X` where the caller has it (read where the whole Gram matrix pays,
        :func:`full_gram_pays`).

    :meth:`start` sets the chains' models; :meth:`conditionals` gives every feature's conditional inclusion
    log-odds, :meth:`flip` moves the chains.
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
        """Zeroed :math:`A^{-1}`, Gram rows and :math:`q` for the chains and the slot capacity."""
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
