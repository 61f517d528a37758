"""Independent reference implementation of the hard concrete law, for the tests only.

Everything here is written straight from the paper (Louizos, Welling & Kingma 2018,
Appendix B-C, Eq. 23-28) and never calls ``l0bayes``:

* pointwise values (atoms, CDF, density) in ``mpmath`` at 50 digits, from the raw Eq. 23-25;
* integrals (normalisation, moments, entropy, KL) with ``scipy.integrate.quad`` of a float64
  evaluation of Eq. 23 (only rewritten as ``log`` + ``logaddexp`` so that ``alpha = e^30`` does
  not lose digits), split at the mode of the logistic variable, ``epsabs=0`` so that tiny
  masses are integrated to full *relative* accuracy.

Parameters are always passed as Python floats; converting them with ``mpmath.mpf(float)`` keeps
exactly the binary values that the code under test receives.
"""

import functools
import math
import warnings

import mpmath
import numpy as np
from scipy import integrate

mpmath.mp.dps = 50

QUAD_KW = dict(epsabs=0.0, epsrel=1e-13, limit=200)


# ----------------------------------------------------------------------------- mpmath, Eq. 23-26
def _mp(*xs):
    return [mpmath.mpf(float(x)) for x in xs]


def mp_sigmoid(x):
    return 1 / (1 + mpmath.exp(-x))


def mp_binary_concrete_pdf(s, a, b):
    """Eq. 23: ``b alpha s^(-b-1) (1-s)^(-b-1) / (alpha s^(-b) + (1-s)^(-b))^2``."""
    alpha = mpmath.exp(a)
    return b * alpha * s ** (-b - 1) * (1 - s) ** (-b - 1) / (alpha * s ** (-b) + (1 - s) ** (-b)) ** 2


def mp_binary_concrete_cdf(s, a, b):
    """Eq. 24: ``Sigmoid((log s - log(1 - s)) b - log alpha)``."""
    return mp_sigmoid((mpmath.log(s) - mpmath.log(1 - s)) * b - a)


def mp_stretched_pdf(x, a, b, l, u):
    """Eq. 25 (left): ``q_s((x - l)/(u - l)) / (u - l)``."""
    x, a, b, l, u = _mp(x, a, b, l, u)
    return mp_binary_concrete_pdf((x - l) / (u - l), a, b) / (u - l)


def mp_stretched_cdf(x, a, b, l, u):
    """Eq. 25 (right): ``Q_s((x - l)/(u - l))``."""
    x, a, b, l, u = _mp(x, a, b, l, u)
    return mp_binary_concrete_cdf((x - l) / (u - l), a, b)


def mp_atoms(a, b, l, u):
    """Eq. 26: ``(P0, P1) = (Qbar(0), 1 - Qbar(1))`` as mpf."""
    return mp_stretched_cdf(0.0, a, b, l, u), 1 - mp_stretched_cdf(1.0, a, b, l, u)


@functools.cache
def atoms(a, b, l, u):
    """Float ``(P0, P1, P0 log P0, P1 log P1, log P0, log P1)`` from mpmath."""
    p0, p1 = mp_atoms(a, b, l, u)
    return dict(
        p0=float(p0),
        p1=float(p1),
        log_p0=float(mpmath.log(p0)),
        log_p1=float(mpmath.log(p1)),
        pc=float(1 - p0 - p1),
    )


def mp_log_prob(z, a, b, l, u):
    """Log density of Eq. 26 w.r.t. ``delta_0 + delta_1 + Lebesgue``, as a float."""
    if z == 0.0:
        return float(mpmath.log(mp_atoms(a, b, l, u)[0]))
    if z == 1.0:
        return float(mpmath.log(mp_atoms(a, b, l, u)[1]))
    if not 0.0 < z < 1.0:
        return -math.inf
    return float(mpmath.log(mp_stretched_pdf(z, a, b, l, u)))


def mp_cdf(z, a, b, l, u):
    if z < 0:
        return 0.0
    if z >= 1:
        return 1.0
    return float(mp_stretched_cdf(z, a, b, l, u))


# ----------------------------------------------------------------------------- float64, quad
def log_qbar(x, a, b, l, u):
    """log of Eq. 25 with Eq. 23 in log form: exact algebra, no overflow at ``alpha = e^30``."""
    log_s = math.log(x - l) - math.log(u - l)
    log_1ms = math.log(u - x) - math.log(u - l)
    log_denominator = np.logaddexp(a - b * log_s, -b * log_1ms)
    log_qs = math.log(b) + a - (b + 1.0) * (log_s + log_1ms) - 2.0 * log_denominator
    return log_qs - math.log(u - l)


def qbar(x, a, b, l, u):
    return math.exp(log_qbar(x, a, b, l, u))


def split_points(*params):
    """Modes of the logistic variable, ``l + (u - l) sigmoid(a / b)``, that lie in (0, 1)."""
    pts = []
    for a, b, l, u in params:
        zstar = l + (u - l) / (1.0 + math.exp(-a / b))
        if 1e-9 < zstar < 1 - 1e-9:
            pts.append(zstar)
    return sorted(pts)


def quad01(f, *params, lo=0.0, hi=1.0):
    pts = [p for p in split_points(*params) if lo < p < hi]
    with warnings.catch_warnings():
        # epsrel=1e-13 is at the limit of float64: quad may report round-off while the value is
        # still accurate to ~1e-13 (checked against mpmath.quad in the tests).
        warnings.simplefilter("ignore", integrate.IntegrationWarning)
        value, _ = integrate.quad(f, lo, hi, points=pts or None, **QUAD_KW)
    return value


@functools.cache
def interior_mass(a, b, l, u):
    return quad01(lambda x: qbar(x, a, b, l, u), (a, b, l, u))


def cdf_by_quad(z, a, b, l, u):
    """``P0 + int_0^z qbar``."""
    p0 = atoms(a, b, l, u)["p0"]
    if z <= 0:
        return p0
    return p0 + quad01(lambda x: qbar(x, a, b, l, u), (a, b, l, u), hi=z)


@functools.cache
def moments(a, b, l, u):
    """``(mean, 1 - mean, variance)``, each a sum of non-negative terms, by quad."""
    at = atoms(a, b, l, u)
    p0, p1 = at["p0"], at["p1"]
    prm = (a, b, l, u)
    mean = p1 + quad01(lambda x: x * qbar(x, *prm), prm)
    complement = p0 + quad01(lambda x: (1.0 - x) * qbar(x, *prm), prm)
    if mean <= 0.5:
        centred = quad01(lambda x: (x - mean) ** 2 * qbar(x, *prm), prm)
    else:
        centred = quad01(lambda x: ((1.0 - x) - complement) ** 2 * qbar(x, *prm), prm)
    variance = p0 * mean**2 + p1 * complement**2 + centred
    return mean, complement, variance


@functools.cache
def entropy(a, b, l, u):
    """``(H, scale)``: ``H = -P0 log P0 - P1 log P1 - int qbar log qbar`` and the sum of the
    absolute values of its terms (the scale for a relative tolerance when ``H`` is near 0)."""
    at = atoms(a, b, l, u)
    prm = (a, b, l, u)
    atom_part = -at["p0"] * at["log_p0"] - at["p1"] * at["log_p1"]
    cont = -quad01(lambda x: qbar(x, *prm) * log_qbar(x, *prm), prm)
    abs_cont = quad01(lambda x: qbar(x, *prm) * abs(log_qbar(x, *prm)), prm)
    return atom_part + cont, abs(atom_part) + abs_cont


@functools.cache
def kl(q, p):
    """Eq. 28: ``(KL, scale)`` for two parameter tuples ``(a, b, l, u)``, the continuous part as
    ``int_0^1 qbar log(qbar / pbar)`` by quad; ``scale`` sums the absolute values of all terms."""
    aq, ap = atoms(*q), atoms(*p)
    t0 = aq["p0"] * (aq["log_p0"] - ap["log_p0"])
    t1 = aq["p1"] * (aq["log_p1"] - ap["log_p1"])

    def integrand(x):
        lq = log_qbar(x, *q)
        return math.exp(lq) * (lq - log_qbar(x, *p))

    cont = quad01(integrand, q, p)
    abs_cont = quad01(lambda x: abs(integrand(x)), q, p)
    return t0 + t1 + cont, abs(t0) + abs(t1) + abs_cont


# ----------------------------------------------------------------------------- for KS tests
def np_logit_t(z, l, u):
    z = np.asarray(z, dtype=np.float64)
    return np.log(z - l) - np.log(u - z)


def np_log_sigmoid(x):
    return -np.logaddexp(0.0, -x)


def truncated_cdf(a, b, l, u):
    """CDF of the continuous part (``sbar`` given ``0 < sbar < 1``), Eq. 24-25, as a vectorised
    function. Written with whichever tail (CDF or survival) is small so that it keeps its
    accuracy when the whole interval is deep in a tail of the logistic variable."""

    def L(z):
        return b * np_logit_t(z, l, u) - a

    L0, L1 = float(L(0.0)), float(L(1.0))

    def cdf(z):
        Lz = L(np.clip(z, 0.0, 1.0))
        if L0 + L1 >= 0:  # upper tail: use the survival function sigmoid(-L)
            s0, s1, sz = np.exp(np_log_sigmoid(-L0)), np.exp(np_log_sigmoid(-L1)), np.exp(np_log_sigmoid(-Lz))
            return (s0 - sz) / (s0 - s1)
        c0, c1, cz = np.exp(np_log_sigmoid(L0)), np.exp(np_log_sigmoid(L1)), np.exp(np_log_sigmoid(Lz))
        return (cz - c0) / (c1 - c0)

    return cdf


def stretched_cdf_np(a, b, l, u):
    """Vectorised Eq. 24-25 on (l, u)."""

    def cdf(x):
        x = np.clip(np.asarray(x, dtype=np.float64), np.nextafter(l, 0), np.nextafter(u, 0))
        return np.exp(np_log_sigmoid(b * np_logit_t(x, l, u) - a))

    return cdf


def mp_stretched_cdf_by_quad(x, a, b, l, u, dps=25):
    """``Qbar(x) = int_0^{(x - l)/(u - l)} q_s(s) ds`` (Eq. 25), Eq. 23 integrated by mpmath's
    tanh-sinh rule, which copes with the ``s^(b - 1)`` end singularity of ``b < 1``."""
    with mpmath.workdps(dps):
        a_, b_, l_, u_, x_ = _mp(a, b, l, u, x)
        return float(mpmath.quad(lambda s: mp_binary_concrete_pdf(s, a_, b_), [0, (x_ - l_) / (u_ - l_)]))
