r"""The arguments of :func:`~l0bayes.selection.select_variables`, checked, and its data, standardised.

Every column of ``X`` is centred and scaled to unit sample standard deviation (``ddof=1``) and ``y`` is centred
and divided by a power of two near its standard deviation (:func:`standardise`), exactly and in float64, so
that the selection is invariant to rescaling the columns of ``X`` and every computation runs near unit scale.
Each mistake is a ``TypeError`` or ``ValueError`` that names the argument.
"""

import math
import numbers

import numpy as np
import torch

from .._checks import COUNT, POSITIVE, PROBABILITY, Rule, check_args, check_seed, whole
from .sampler.gibbs import NOISE_FLOOR

FAMILIES = ("gaussian", "bernoulli")
METHODS = ("auto", "variational", "mcmc")
MIN_DRAWS = 100  # importance draws per round at least: Pareto k-hat is fitted to the largest fifth of them
MAX_DRAWS = 10**7  # importance draws per round at most
# and at most this many bytes for one round's draws (num_draws * p values of 8 bytes), checked before allocating
MAX_DRAW_BYTES = 2**32
CONSTANT = 1e-12  # a column whose standard deviation is below this fraction of its magnitude is constant
# slab_scale and noise_scale (Gaussian) within this range times the standard deviation of y: the fit's own noise
# estimate is floored at its lower end
SCALE_RANGE = (NOISE_FLOOR, 1e6)
LOGIT_SLAB_RANGE = (1e-6, 1e6)  # slab_scale of the Bernoulli family (logits per standard deviation of a feature)
# Gaussian family, noise_scale=None, a sampler: with at most this many observations and p >= n - 1 the sampler
# reaches models that fit y exactly, where the noise posterior under the Jeffreys prior is improper
FEW_ROWS = 10
ARG_CHECKS = {
    "prior_inclusion": PROBABILITY.or_none(),
    "slab_scale": POSITIVE.or_none(),
    "noise_scale": POSITIVE.or_none(),
    "num_draws": Rule(
        f"a whole number >= {MIN_DRAWS} and <= {MAX_DRAWS:,}",
        lambda v: (v >= MIN_DRAWS) & (v <= MAX_DRAWS),
        integer=True,
    ),
    "time_budget": Rule("a number of seconds > 0 (inf: no limit)", lambda v: v > 0).or_none(),
}
OPTION_CHECKS = {  # the advanced options of select_variables
    "num_effects": COUNT,
    "tol": POSITIVE,
    "max_iter": COUNT,
    "rounds": COUNT,
    "lr": POSITIVE,
    "max_steps": COUNT,
    "num_chains": COUNT,
    "mcmc_steps": COUNT,
}


def check_arguments(
    family,
    method,
    prior_inclusion,
    slab_scale,
    noise_scale,
    num_draws,
    time_budget,
    seed,
    dtype,
    feature_names,
    options,
):
    """The arguments of :func:`~l0bayes.selection.select_variables` that need no data, checked in its order.

    :returns: ``(hyper, seed, options, time_budget)``: ``(prior_inclusion, slab_scale, noise_scale)`` as floats
        (or ``None``), the seed as an int, the advanced ``options`` as whole numbers or floats, the time budget
        as a float (or ``None``).
    :raises ValueError: naming the argument, its value and what is accepted (``TypeError`` for a wrong type).
    """
    owner = "select_variables"
    for name, value, allowed in (("family", family, FAMILIES), ("method", method, METHODS)):
        if not isinstance(value, str) or value not in allowed:
            raise ValueError(f"{owner}: {name} must be one of {allowed}, got {value!r}")
    check_args(
        owner,
        ARG_CHECKS,
        prior_inclusion=prior_inclusion,
        slab_scale=slab_scale,
        noise_scale=noise_scale,
        num_draws=num_draws,
        time_budget=time_budget,
    )
    if family == "bernoulli" and noise_scale is not None:
        raise ValueError(f"{owner}: noise_scale is for family='gaussian' (bernoulli has no noise), got {noise_scale!r}")
    seed = check_seed(seed)
    if dtype not in (torch.float32, torch.float64):
        raise ValueError(
            f"{owner}: dtype must be torch.float32 or torch.float64 (the precision of the computation; X and y of "
            f"any real dtype are converted to it), got {dtype!r}"
        )
    check_feature_names(feature_names)
    unknown = set(options) - set(OPTION_CHECKS)
    if unknown:
        raise TypeError(f"{owner}: unknown options {sorted(unknown)}; the options are {sorted(OPTION_CHECKS)}")
    check_args(owner, OPTION_CHECKS, **options)
    options = {k: whole(v) if OPTION_CHECKS[k].integer else float(v) for k, v in options.items()}
    hyper = tuple(None if v is None else float(v) for v in (prior_inclusion, slab_scale, noise_scale))
    budget = None if time_budget is None else float(time_budget)
    return hyper, seed, options, budget


def check_feature_names(feature_names):
    """``feature_names``: ``None``, or a sequence (list, tuple, array) of names, each a string or an int."""
    if feature_names is None:
        return
    sized = hasattr(feature_names, "__len__") and hasattr(feature_names, "__iter__")
    if isinstance(feature_names, (str, bytes, dict)) or not sized:
        raise TypeError(
            "select_variables: feature_names must be a sequence of names (one string per column of X), got "
            f"{type(feature_names).__name__} {feature_names!r}"
        )
    for name in feature_names:
        if isinstance(name, bool) or not isinstance(name, (str, numbers.Integral)):
            raise TypeError(
                "select_variables: feature_names must be a sequence of names (one string, or int, per column of X), "
                f"got an entry {type(name).__name__} {name!r}"
            )


def check_draws_fit(num_draws, p):
    """Refuse ``num_draws`` whose draws of ``p`` features would take more than :data:`MAX_DRAW_BYTES` (8 bytes
    each), before anything is allocated."""
    if num_draws * p * 8 > MAX_DRAW_BYTES:
        most = max(MAX_DRAW_BYTES // (8 * p), 1)
        raise ValueError(
            f"select_variables: num_draws={num_draws} draws of {p} features take {num_draws * p * 8 / 2**30:.3g} GiB "
            f"per round, beyond the limit of {MAX_DRAW_BYTES / 2**30:g} GiB (num_draws * p * 8 bytes): give "
            f"num_draws <= {most}"
        )


def resolve_device(device, X):
    """The device to compute on: ``device``, else that of a tensor ``X``, else the CPU; checked to be usable."""
    if device is None:
        device = X.device if isinstance(X, torch.Tensor) else torch.device("cpu")
        name = "the device of X"
    elif not isinstance(device, (str, torch.device)):
        raise TypeError(f"select_variables: device must be None, a string or a torch.device, got {device!r}")
    else:
        name = "device"
        try:
            device = torch.device(device)
            torch.empty(0, device=device)
        except (RuntimeError, AssertionError) as err:
            raise ValueError(f"select_variables: device {str(device)!r} cannot be used here: {err}") from None
    if device.type == "meta":
        raise ValueError(
            f"select_variables: {name} is {str(device)!r}, which holds no values and cannot compute: give device "
            "'cpu' or an accelerator ('cuda'), and X as values"
        )
    return device


def internal_scales(hyper, family, k, y_sd):
    r"""``slab_scale`` and ``noise_scale`` in the units of the standardised ``y`` (divided by ``2**k``), each
    checked to lie within :data:`SCALE_RANGE` times ``y``'s standard deviation (Gaussian) or in
    :data:`LOGIT_SLAB_RANGE` (bernoulli, logit units)."""
    prior_inclusion, slab_scale, noise_scale = hyper
    out = [prior_inclusion]
    for name, value in (("slab_scale", slab_scale), ("noise_scale", noise_scale)):
        if value is None:
            out.append(None)
            continue
        if family == "bernoulli":
            lo, hi = LOGIT_SLAB_RANGE
            if not lo <= value <= hi:
                raise ValueError(
                    f"select_variables: slab_scale must lie in [{lo:g}, {hi:g}] for family='bernoulli' (the prior sd "
                    f"of a coefficient, in logits per standard deviation of its feature), got {value!r}"
                )
            out.append(value)
            continue
        inner = math.ldexp(value, -k)
        lo, hi = SCALE_RANGE
        if not lo * y_sd <= inner <= hi * y_sd:
            sd = math.ldexp(y_sd, k)
            raise ValueError(
                f"select_variables: {name} must lie within [{lo:g}, {hi:g}] x the standard deviation of y ({sd:.6g}), "
                f"that is in [{lo * sd:.6g}, {hi * sd:.6g}], got {value!r}: beyond, the spike-and-slab posterior "
                "is its limit (every probability at the prior, or at 0) and its computation overflows"
            )
        out.append(inner)
    return tuple(out)


def check_noise_identifiable(n, p, family, noise_given, method):
    r"""Refuse a sampler that would draw the noise where a model can fit ``y`` exactly (:data:`FEW_ROWS`).

    With ``noise_scale=None`` the sampler draws :math:`\sigma` under the Jeffreys prior, whose posterior is
    improper where a model of ``n - 1`` features fits ``y`` exactly; with few rows the sampler reaches such models.
    """
    if family == "gaussian" and not noise_given and method != "variational" and n - 1 <= p and n <= FEW_ROWS:
        raise ValueError(
            f"select_variables: {n} observations for {p} features: with noise_scale=None the sampler draws the noise "
            "under the Jeffreys prior, whose posterior is improper where a model of n - 1 features fits y exactly, "
            f"and with n <= {FEW_ROWS} the sampler reaches such models. Pass noise_scale, or method='variational' "
            f"(the fit's own noise estimate), or use more than {FEW_ROWS} (or more than p + 1) observations"
        )


def feature_list(feature_names, p):
    """The names of the ``p`` features: ``feature_names`` as a list, checked to hold ``p``, else ``0 .. p - 1``."""
    names = list(feature_names) if feature_names is not None else list(range(p))
    if len(names) != p:
        raise ValueError(f"select_variables: feature_names holds {len(names)} feature names for the {p} columns of X")
    return names


def as_float64(a, name, device):
    """``a`` as a float64 tensor on ``device``: any real (or boolean) array or tensor, finite; else a clear error."""
    if isinstance(a, torch.Tensor):
        if a.is_complex():
            raise TypeError(f"select_variables: {name} must be real, got a {a.dtype} tensor")
        t = a.detach().to(device=device, dtype=torch.float64)
    else:
        try:
            array = np.asarray(a)
        except (TypeError, ValueError) as err:
            raise TypeError(f"select_variables: {name} must be a numeric array or tensor") from err
        if array.dtype.kind not in "biuf":
            raise TypeError(f"select_variables: {name} must be a real numeric array or tensor, got dtype {array.dtype}")
        t = torch.as_tensor(array.astype(np.float64), device=device)
    if not torch.isfinite(t).all():
        raise ValueError(f"select_variables: {name} contains NaN or infinite values")
    return t


def _to_unit(v):
    r"""``v`` (float64, columns last) divided by a power of two near the largest magnitude of each column, and the
    exponents: exact, so means and standard deviations are then computed without overflow or underflow at any
    scale, and a column rescaled by a power of two gives the same bits."""
    _, exponent = torch.frexp(v.abs().amax(0))
    half = torch.div(exponent, 2, rounding_mode="floor")  # two steps: 2**exponent alone can overflow
    one = torch.ones(exponent.shape, dtype=v.dtype, device=v.device)
    return v * torch.ldexp(one, -half) * torch.ldexp(one, half - exponent), exponent


def _nearly_constant(mean, scale):
    """Columns (in the units of :func:`_to_unit`, magnitudes below 1) whose spread is at rounding level."""
    return ~(scale > CONSTANT * (1.0 + mean.abs()))


def standardise(x, y, family):
    r"""Centre and scale the columns of ``x`` (``ddof=1``); centre ``y`` and scale it by a power of two near its
    standard deviation for the Gaussian family.

    Everything in float64. Returns the standardised ``x`` and ``y``, the columns' standard deviations as
    ``(mantissa, exponent)`` (``std = mantissa * 2**exponent``), the exponent ``k`` of the scale ``2**k`` that
    divides ``y`` (0 for bernoulli) and ``y``'s standard deviation in those units. Standardising ``X`` makes the
    selection invariant to rescaling its columns; scaling ``y`` keeps every computation near unit scale whatever
    its units (``slab_scale`` and ``noise_scale`` are divided by the same power of two).
    """
    if x.dim() != 2:
        raise ValueError(f"select_variables: X must have shape (n, p), got {tuple(x.shape)}")
    if y.dim() != 1 or y.shape[0] != x.shape[0]:
        raise ValueError(
            f"select_variables: y must have shape ({x.shape[0]},) to match X of shape {tuple(x.shape)}, "
            f"got {tuple(y.shape)}"
        )
    n, p = x.shape
    if n < 3:
        raise ValueError(f"select_variables: need at least 3 observations (rows of X and y), got {n}")
    if p < 1:
        raise ValueError("select_variables: X has no columns")
    unit, exponent = _to_unit(x)
    mean, scale = unit.mean(0), unit.std(0)
    constant = torch.nonzero(_nearly_constant(mean, scale)).flatten()
    if constant.numel():
        raise ValueError(
            f"select_variables: X has constant columns {constant.tolist()[:10]}: drop them (they cannot be selected)"
        )
    xs = (unit - mean) / scale
    if family == "bernoulli":
        if not bool(((y == 0) | (y == 1)).all()):
            raise ValueError("select_variables: family='bernoulli' needs y in {0, 1}")
        if bool((y == y[0]).all()):
            raise ValueError(
                f"select_variables: y has one class only (every label is {int(y[0])}): nothing to tell apart, "
                "family='bernoulli' needs both 0 and 1 in y"
            )
        return xs, y, (scale, exponent), 0, 1.0
    y_unit, y_exponent = _to_unit(y[:, None])
    y_mean, y_sd = y_unit.mean(0), y_unit.std(0)
    if bool(_nearly_constant(y_mean, y_sd)):
        raise ValueError("select_variables: y is constant: nothing to select")
    _, k = math.frexp(float(y_sd))  # y_sd = m * 2**k with m in [0.5, 1): divide by 2**k
    centred = torch.ldexp(y_unit[:, 0] - y_mean, torch.tensor(-k, device=y.device))
    return xs, centred, (scale, exponent), int(y_exponent) + k, math.ldexp(float(y_sd), -k)
