r"""What :func:`~l0bayes.selection.sampler.gibbs.tempered_gibbs` returns, and its Monte Carlo error.

Each chain's steps are summed in blocks; for feature :math:`j` the block
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

from .convergence import ess_mean, rank_rhat

RHAT_MAX = 1.01  # Vehtari, Gelman, Simpson, Carpenter & Bürkner (2021): R-hat below 1.01
ESS_MIN = 100  # and at least 100 effective draws for every probability that matters
RELEVANT = 0.01  # the probabilities that matter for the mixing verdict
MAX_BLOCKS = 256  # blocks kept per chain (pairs merge when full)
MAX_STATES = 1000  # thinned states kept per chain (at least this many, fewer than twice)


@dataclass
class TemperedGibbsResult:
    r"""What :func:`~l0bayes.selection.sampler.gibbs.tempered_gibbs` returns (numpy arrays over the ``p`` features).

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
    :ivar num_steps: steps per chain after warm-up (as many as the run's
        :class:`~l0bayes.selection.sampler.run_length.RunLength` allowed).
    :ivar num_warmup: warm-up steps per chain (its ``warmup``).
    :ivar seconds: wall time.
    :ivar details: ``omega_fraction`` (share of steps that updated :math:`\omega` or :math:`\sigma`),
        ``stopped`` (what ended the run: ``"mixed"`` at a convergence check, ``"time"`` at the time budget or
        ``"steps"`` at ``max_steps``), ``noise_scale_mean`` (posterior mean of :math:`\sigma` when it is sampled).
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
            self.rhat, self.mcse, self.ess = block_diagnostics(bh, bw, self.inclusion, seen_at)
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


class BlockSums:
    """Block sums of one quantity per chain; when :data:`MAX_BLOCKS` are full, neighbours merge (bounded memory).

    :meth:`add` takes the ``(C, ...)`` value of one step of the ``C`` chains; :attr:`total` is the sum over every
    step and chain so far.
    """

    def __init__(self):
        self.sums = []  # list of (C, ...) tensors
        self.size = 1  # steps per stored block
        self.open = None
        self.count = 0
        self.total = 0.0

    def add(self, value):
        """Add one step's ``(C, ...)`` value to the open block (closed once it holds :attr:`size` steps)."""
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


class StateSnapshots:
    """Thinned states of every chain as index arrays of their included features, with their log weights.

    Every ``thin``-th state at first; the interval doubles whenever twice :data:`MAX_STATES` are kept, so 1000 to
    2000 remain per chain. States wait in a device buffer and are converted in batches of :attr:`BUFFER` (one
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
        """Convert the buffered states to index arrays (then thin the kept ones if there are too many)."""
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


def _rhat_ess(blocks_h, blocks_w, pip, select):
    """Rank R-hat and the MCSE of the ratio estimate for the features in ``select`` (block sums in), as ArviZ
    computes them, for all the features at once (:mod:`l0bayes.selection.sampler.convergence`)."""
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


def block_diagnostics(bh, bw, pip, seen_at):
    r"""R-hat, MCSE and ESS per feature from the block sums of the chains (``bh``: ``(C, B, p)``, ``bw``: ``(C, B)``).

    ArviZ computes R-hat and the MCSE of the features that some chain puts at ``seen_at`` or
    above; for the others (every chain says almost 0) the MCSE is the standard error of the
    chains' own estimates and R-hat is ``nan``.

    :param bh: numpy ``(C, B, p)``: per chain and block, the sum of the weighted conditionals :math:`w_t \pi_j`.
    :param bw: numpy ``(C, B)``: the sum of the weights :math:`w_t`.
    :param pip: numpy ``(p,)``: the estimate pooled over the chains.
    :param float seen_at: the probability from which a feature is diagnosed by ArviZ's rules.
    :returns: ``(rhat, mcse, ess)``, numpy ``(p,)`` each (``nan`` MCSE with fewer than 4 blocks).
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


def chain_result(acc, snapshots, done, warmup, began, omega_moves, C, seen_at, diagnose=True):
    """The :class:`TemperedGibbsResult` of the chains so far.

    :param acc: ``{"pip", "w", "coef"}``: the :class:`BlockSums` of the weighted conditionals, the weights and the
        weighted conditional means.
    :param snapshots: the chains' :class:`StateSnapshots`.
    :param int done: steps per chain after warm-up; ``warmup`` those before.
    :param float began: :func:`time.perf_counter` at the start.
    :param int omega_moves: steps that updated the auxiliary coordinate, over ``C`` chains.
    :param float seen_at: as in :func:`block_diagnostics`.
    :param bool diagnose: compute R-hat, MCSE and ESS now; else keep the block sums until
        :meth:`TemperedGibbsResult.diagnose`.
    """
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
