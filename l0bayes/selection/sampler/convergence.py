r"""Convergence diagnostics of several Markov chains, for many quantities at once.

The rank-normalised split :math:`\hat R` and the effective sample size of the mean of Vehtari, Gelman,
Simpson, Carpenter & Bürkner (2021), "Rank-normalization, folding, and localization: an improved
:math:`\hat R` for assessing convergence of MCMC", *Bayesian Analysis* 16(2), with the same conventions
as ArviZ's ``rhat(method="rank")`` and ``ess(method="mean")`` (split chains, Blom's rank offset 3/8,
Geyer's initial positive and monotone sequences), so that they agree with ArviZ to rounding
(``tests/test_convergence.py``).

Why not ArviZ itself: it evaluates these one quantity at a time in Python. The exact sampler of
:func:`~l0bayes.select_variables` needs them for every feature with a probability that matters, often
several hundred: at p = 1000 ArviZ took 2.6 s per diagnosis (more than the sampling), these functions
a few milliseconds (the variable-selection section of ``benchmarks/RESULTS.md``).

Every function takes ``draws`` of shape ``(chains, draws, k)`` and returns ``(k,)``.
"""

import numpy as np
from scipy import fft, special, stats

__all__ = ["ess_mean", "rank_rhat"]

MIN_DRAWS = 4  # fewer draws per chain: no diagnostic (nan)


def rank_rhat(draws):
    r"""Rank-normalised split :math:`\hat R` per quantity: the larger of the bulk and the tail (folded) one.

    :param draws: ``(chains, draws, k)`` array.
    :returns: ``(k,)`` float64 array; ``nan`` with fewer than 2 chains or 4 draws, for a quantity with a NaN
        draw, or one whose draws are all equal.
    """
    a = np.asarray(draws, dtype=np.float64)
    out = np.full(a.shape[2], np.nan)
    if a.shape[0] < 2 or a.shape[1] < MIN_DRAWS:
        return out
    valid = ~np.isnan(a).any(axis=(0, 1))
    if not valid.any():
        return out
    split = _split_chains(a[:, :, valid])
    bulk = _basic_rhat(_z_scale(split))
    folded = np.abs(split - np.median(split, axis=(0, 1)))
    tail = _basic_rhat(_z_scale(folded))
    out[valid] = np.where(tail > bulk, tail, bulk)  # max(bulk, tail), nan where the bulk one is nan
    return out


def ess_mean(draws):
    r"""Effective sample size of the mean per quantity, from the split chains' autocorrelations.

    :param draws: ``(chains, draws, k)`` array.
    :returns: ``(k,)`` float64 array; ``nan`` with fewer than 4 draws or a NaN draw; the number of split
        draws for a quantity whose draws are all equal.
    """
    a = np.asarray(draws, dtype=np.float64)
    k = a.shape[2]
    out = np.full(k, np.nan)
    if a.shape[1] < MIN_DRAWS:
        return out
    valid = ~np.isnan(a).any(axis=(0, 1))
    split = _split_chains(a[:, :, valid])
    chains, n = split.shape[:2]
    span = split.max(axis=(0, 1)) - split.min(axis=(0, 1))
    constant = span < np.finfo(np.float64).resolution
    ess = np.full(split.shape[2], float(chains * n))
    vary = ~constant
    if vary.any():
        ess[vary] = _ess(split[:, :, vary])
    out[valid] = ess
    return out


def _split_chains(a):
    """``(C, N, k)`` -> ``(2C, N // 2, k)``: each chain's first and last halves (a middle draw dropped)."""
    half = a.shape[1] // 2
    return np.concatenate([a[:, :half], a[:, a.shape[1] - half :]], axis=0)


def _z_scale(a):
    """Ranks over all draws of each quantity (ties averaged), mapped to normal scores with Blom's offset."""
    chains, n, k = a.shape
    rank = stats.rankdata(a.reshape(chains * n, k), method="average", axis=0)
    return special.ndtri((rank - 0.375) / (chains * n + 0.25)).reshape(chains, n, k)


def _basic_rhat(a):
    n = a.shape[1]
    between = n * a.mean(axis=1).var(axis=0, ddof=1)
    within = a.var(axis=1, ddof=1).mean(axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.sqrt((between / within + n - 1) / n)


def _autocovariance(a):
    """Autocovariance at every lag along the draws (axis 1), by FFT with zero padding (no wrap-around)."""
    n = a.shape[1]
    m = fft.next_fast_len(2 * n)
    centred = a - a.mean(axis=1, keepdims=True)
    spectrum = np.fft.rfft(centred, n=m, axis=1)
    return np.fft.irfft(spectrum * np.conjugate(spectrum), n=m, axis=1)[:, :n] / n


def _ess(a):
    """Geyer's initial positive, then monotone, sequence of autocorrelations, for every quantity at once."""
    chains, n, k = a.shape
    acov = _autocovariance(a).mean(axis=0)  # (n, k): the chains' mean autocovariance per lag
    mean_var = acov[0] * n / (n - 1.0)
    var_plus = mean_var * (n - 1.0) / n
    if chains > 1:
        var_plus = var_plus + a.mean(axis=1).var(axis=0, ddof=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        rho = 1.0 - (mean_var - acov) / var_plus  # (n, k), lag 0 is 1 up to rounding
    rho_t = np.zeros((n, k))
    rho_t[0] = 1.0
    rho_t[1] = rho[1]
    even, odd = np.ones(k), rho[1].copy()
    last = np.ones(k, dtype=np.int64)  # each quantity's t when its positive sequence ended
    active = even + odd > 0.0
    t = 1
    while t < n - 3 and active.any():
        e, o = rho[t + 1], rho[t + 2]
        even, odd = np.where(active, e, even), np.where(active, o, odd)
        keep = active & (e + o >= 0)
        rho_t[t + 1] = np.where(keep, e, rho_t[t + 1])
        rho_t[t + 2] = np.where(keep, o, rho_t[t + 2])
        last = np.where(active, t + 2, last)
        active &= even + odd > 0.0
        t += 2
    max_t = last - 2
    columns = np.arange(k)
    improve = even > 0
    rho_t[max_t[improve] + 1, columns[improve]] = even[improve]
    t = 1
    while t <= max_t.max() - 2:
        pair = rho_t[t - 1] + rho_t[t]
        fix = (t <= max_t - 2) & (rho_t[t + 1] + rho_t[t + 2] > pair)
        rho_t[t + 1] = np.where(fix, pair / 2.0, rho_t[t + 1])
        rho_t[t + 2] = np.where(fix, pair / 2.0, rho_t[t + 2])
        t += 2
    total = chains * n
    cumulative = np.cumsum(rho_t, axis=0)
    head = np.where(max_t >= 0, cumulative[np.maximum(max_t, 0), columns], 0.0)
    nxt = max_t + 1
    tail = np.where(nxt < n, rho_t[np.minimum(nxt, n - 1), columns], 0.0)
    tau = np.maximum(-1.0 + 2.0 * head + tail, 1.0 / np.log10(total))
    ess = total / tau
    return np.where(np.isnan(rho_t).any(axis=0), np.nan, ess)
