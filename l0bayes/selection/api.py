r"""Variable selection for people who are not Pyro users: :func:`select_variables`.

Gaussian family (the default). Three steps, each chosen by measurement (the variable-selection
guide of the docs has the numbers):

1. Standardise: every column of ``X`` is centred and scaled to unit sample standard deviation
   (``ddof=1``), ``y`` is centred. ``slab_scale`` (the prior sd of a coefficient)
   and ``noise_scale`` are therefore in units of ``y`` per standard deviation of a feature,
   exactly the model of :func:`~l0bayes.selection.exact_inclusion_probabilities` applied to the
   standardised data. The selection is invariant to rescaling the columns of ``X``, and to rescaling
   ``y`` together with ``slab_scale`` and ``noise_scale`` (the estimated ones follow ``y``): inside, ``y``
   is also divided by a power of two near its standard deviation, and the scales with it.
2. Fit a structured guide, a sum of single effects
   (:func:`~l0bayes.selection.fit_single_effects`): each effect picks one of a
   group of correlated features and spreads its probability over the group, where a mean-field
   guide commits to one member. The number of effects grows until one stays empty, and the
   fit stops when its ELBO has stabilised.
3. Check and correct: the fit's probabilities define a product-Bernoulli proposal; its draws are
   reweighted to the exact collapsed posterior of the spike-and-slab model with
   ``prior_inclusion``, ``slab_scale`` and ``noise_scale`` (Pareto-smoothed importance sampling,
   :mod:`l0bayes.selection.importance`), in two or three adaptive rounds; the last round's
   probabilities are Rao-Blackwellised (each drawn model contributes every feature's conditional
   inclusion probability, not its 0/1 indicator). With Pareto :math:`\hat k \le 0.7` the
   reweighted probabilities estimate the exact ones.

4. Then (``method="auto"``, the default) the exact posterior is sampled by weighted tempered
   Gibbs sampling (Zanella & Roberts, 2019; :mod:`l0bayes.selection.sampler.gibbs`), started
   from the fit: 4 chains x 1,250 steps, as many weighted draws as millipede's default run, at most
   ``time_budget`` seconds. Where the check failed its Rao-Blackwellised probabilities, with
   R-hat, ESS and a Monte Carlo standard error each, are returned (``result.method == "mcmc"``);
   where it passed a short run (4 chains x 150 steps after 50 of warm-up) tests it: :math:`\hat k`
   only sees what the fit proposes, and a sampler that moves a probability by more than 0.2 (plus
   twice its Monte Carlo error) has found mass the fit missed, so the full run's answer is returned
   instead. No probability above 0.9 is returned without a
   passed check or a mixed chain: such a probability is returned as 0.9 (``result.capped``).

Bernoulli family: the mean-field hard concrete model
(:class:`~l0bayes.models.SparseLogisticRegression`, Gaussian slab) fitted full batch until the
free energy stabilises; its draws :math:`(z, \tilde\theta)` are reweighted to the exact joint
density (the mixed log-density of the gates, Eq. 26, and the slab), with the same
:math:`\hat k` diagnostic; where it fails, the sampler runs on the Pólya-Gamma augmented model. The credible
sets are those of a sum of single effects fitted to the centred labels.

The steps live beside this module: the arguments in :mod:`l0bayes.selection.arguments`, the families in
:mod:`l0bayes.selection.gaussian` and :mod:`l0bayes.selection.bernoulli`, the sampler's part in
:mod:`l0bayes.selection.mcmc`, the result in :mod:`l0bayes.selection.result`.
"""

import math
import warnings

import numpy as np
import torch

from .._checks import whole
from ..threads import thread_policy
from .arguments import (
    as_float64,
    check_arguments,
    check_draws_fit,
    check_noise_identifiable,
    feature_list,
    internal_scales,
    resolve_device,
    standardise,
)
from .bernoulli import select_bernoulli
from .gaussian import select_gaussian
from .importance import KHAT_THRESHOLD
from .mcmc import refine, verify
from .result import SelectionResult, cap_probabilities

TIME_BUDGET = 15.0  # default seconds for the sampler (an upper bound; its steps usually end it first)
MCMC_STEPS = 1250  # method="auto": steps per chain after warm-up; 4 chains give 5,000 weighted draws (millipede's T)
MAX_MCMC_STEPS = 100_000  # method="mcmc": until mixed or the time budget, at most this many
# Bernoulli family, methods "auto" and "mcmc": at most this many steps of the logistic fit, which there is the
# importance check's proposal and the sampler's start (benchmarks/RESULTS.md, "Choice of the sampler, by
# measurement": 3-6 s less than the fit's own stopping rule, AUPRC unchanged within its spread); "variational"
# keeps 5000, as its answer is the fit itself
LOGISTIC_START_STEPS = 800


def select_variables(
    X,
    y,
    family="gaussian",
    prior_inclusion=None,
    slab_scale=None,
    noise_scale=None,
    feature_names=None,
    device=None,
    dtype=torch.float64,
    num_draws=2000,
    seed=0,
    method="auto",
    time_budget=None,
    threads="auto",
    **options,
):
    r"""Which features of ``X`` matter for ``y``? Inclusion probabilities you can check.

    :param X: ``(n, p)`` numpy array or tensor of any real dtype (no NaN, no constant column; ``n >= 3``;
        ``p > n`` is fine).
    :param y: ``(n,)``: real for ``family="gaussian"`` (a ``y`` of two values, class labels, is a ``UserWarning``
        that points to ``family="bernoulli"``), 0/1 for ``family="bernoulli"`` (both labels present).
    :param prior_inclusion: :math:`\pi_0`, the prior probability that a feature is included;
        ``None``: estimated (the fit's expected number of effects over :math:`p`, at most 0.5; for
        bernoulli that of a sum of single effects fitted to the centred labels).
    :param slab_scale: :math:`\tau`, the prior sd of an included coefficient per standard
        deviation of its feature, in units of ``y`` (bernoulli: logits); ``None``: the root mean square of
        the selected coefficients (1 for bernoulli). Gaussian: within ``[1e-6, 1e6]`` times the standard
        deviation of ``y`` (bernoulli: within ``[1e-6, 1e6]``); beyond, the posterior is its limit (every
        probability at the prior, or at 0) and the computation overflows.
    :param noise_scale: :math:`\sigma`, fixed when given (Gaussian family; within ``[1e-6, 1e6]`` times the
        standard deviation of ``y``); else estimated by the fit, and sampled by the exact sampler when it runs
        (prior :math:`p(\sigma^2) \propto 1/\sigma^2`; ``result.noise_scale`` is then its posterior mean).
        That posterior is improper where a model fits ``y`` exactly (``n - 1`` features can): with ``n <= 10``
        and ``p >= n - 1`` a sampler (``method`` ``"auto"`` or ``"mcmc"``) needs ``noise_scale``, and a chain
        whose noise collapses stops with an error that says so.
    :param feature_names: names for the result, one string per column of ``X`` (default the column indices).
    :param device: where to compute (``"cpu"``, ``"cuda"``; default: the device of a tensor ``X``, else CPU).
    :param int num_draws: importance-sampling draws per round (at least 100, at most 10,000,000, and at most
        ``2**32`` bytes of draws per round: ``num_draws * p * 8 <= 2**32``).
    :param int seed: the seed of every random draw, a whole number in ``[0, 2**64)``.
    :param dtype: the precision of the computation, ``torch.float64`` (default) or ``torch.float32``;
        ``X`` and ``y`` of any real dtype (or a mix) are converted to it after being standardised in float64.
    :param str method: ``"auto"`` (default): the fit, checked by importance sampling, then weighted
        tempered Gibbs sampling of the exact posterior
        (:func:`~l0bayes.selection.tempered_gibbs`) started from the fit, 4 chains x 1,250
        steps (5,000 weighted draws). Where the check fails (Pareto :math:`\hat k > 0.7`) the answer is the
        sampler's; where it passes, a short run (4 chains x 150 steps) tests it: the reweighted fit stands if
        no probability differs from the short run's by more than 0.2 plus twice its Monte Carlo error
        (``details["verified"]``), else the full run's answer is returned (``details["check_contradicted"]``):
        :math:`\hat k` cannot see a mode the fit never proposes. ``"mcmc"``: the sampler until it mixes or
        ``time_budget`` ends. ``"variational"``: no sampler.
    :param time_budget: at most this many seconds for the sampler (default 15; ``inf``: no limit); it stops
        earlier once every probability of at least 0.01 has R-hat <= 1.01 and ESS >= 100, or (``"auto"``)
        after its steps.
    :param threads: torch's intra-op thread count during the fit, as in :func:`~l0bayes.inference.train`
        (:func:`~l0bayes.threads.thread_policy`): ``"auto"`` one thread unless the environment or an enclosing
        ``thread_policy`` chose, ``None`` torch's count, or an int; the caller's count is restored after.
    :param options: advanced: ``num_effects`` (10, the starting number of single effects),
        ``tol`` (1e-3 nats for the ELBO; 1e-4 relative for bernoulli), ``max_iter`` (100 sweeps),
        ``rounds`` (3 adaptive rounds at most), ``lr`` (0.05) and ``max_steps`` (5000 with ``"variational"``,
        else 800: there the fit is the check's proposal and the sampler's start) for bernoulli;
        for the sampler ``num_chains`` (4) and ``mcmc_steps`` (steps per chain after warm-up: 1,250 for
        ``"auto"``, at most 100,000 for ``"mcmc"``). Counts are whole numbers >= 1, ``tol`` and ``lr`` finite
        and positive.
    :returns: :class:`~l0bayes.selection.SelectionResult`; ``result.method`` says which method produced the
        probabilities and ``result.diagnostic`` in one line whether to trust them.

    No probability above 0.9 is returned without a passed check or a mixed chain: a feature the
    sampler puts above 0.9 whose own R-hat or ESS fails (R-hat > 1.01 or ESS < 100), or any
    probability above 0.9 of an unchecked fit (``"variational"`` with :math:`\hat k > 0.7`), is
    returned as 0.9 and listed in ``result.capped``.

    With ``prior_inclusion``, ``slab_scale`` and ``noise_scale`` all given, the Gaussian result
    estimates :func:`~l0bayes.selection.exact_inclusion_probabilities` of the standardised data
    with the same arguments. A warning is issued when the check fails.
    """
    hyper, seed, options, budget = check_arguments(
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
    )
    with thread_policy(threads):
        run = dict(device=device, dtype=dtype, num_draws=whole(num_draws), seed=seed, method=method, time_budget=budget)
        return _select(X, y, family, hyper, feature_names, run, options)


def _warn_binary(y):
    """A ``UserWarning`` where ``y`` takes exactly two values (scikit-learn's ``type_of_target``: ``"binary"``), which
    the Gaussian family treats as real numbers."""
    values = torch.unique(y)
    if values.numel() == 2:
        low, high = (f"{float(v):g}" for v in values)
        warnings.warn(
            f"y takes two values only ({low} and {high}): a binary target, which family='gaussian' models as real "
            "numbers with Gaussian noise; for two classes use family='bernoulli' (the logistic model)",
            UserWarning,
            stacklevel=4,
        )


def _select(X, y, family, hyper, feature_names, run, options):
    """:func:`select_variables` after its argument checks, under its thread policy.

    ``hyper``: ``(prior_inclusion, slab_scale, noise_scale)``; ``run``: device, dtype, num_draws, seed,
    method and time_budget, checked.
    """
    device, dtype, num_draws, seed = run["device"], run["dtype"], run["num_draws"], run["seed"]
    method, time_budget = run["method"], run["time_budget"]
    device = resolve_device(device, X)
    x = as_float64(X, "X", device)
    if x.dim() == 2:
        check_draws_fit(num_draws, x.shape[1])
    yt = as_float64(y, "y", device)
    if family == "gaussian" and yt.dim() == 1:
        _warn_binary(yt)
    xs, yc, (x_scale, x_exponent), k, y_sd = standardise(x, yt, family)
    xs, yc = xs.to(dtype), yc.to(dtype)
    noise_given = hyper[2] is not None
    check_noise_identifiable(*xs.shape, family, noise_given, method)
    prior_inclusion, slab_scale, noise_scale = internal_scales(hyper, family, k, y_sd)
    names = feature_list(feature_names, x.shape[1])
    generator = torch.Generator(device=device).manual_seed(seed)
    opts = {
        "num_effects": 10,
        "tol": 1e-3 if family == "gaussian" else 1e-4,
        "max_iter": 100,
        "rounds": 3,
        "lr": 0.05,
        "max_steps": 5000 if method == "variational" else LOGISTIC_START_STEPS,
        "num_draws": num_draws,
        "generator": generator,
        "num_chains": 4,
        "mcmc_steps": MCMC_STEPS if method == "auto" else MAX_MCMC_STEPS,
        **options,
    }
    # the Bernoulli fit draws its gates from the global generator: seed it, leaving the caller's state alone
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        if family == "gaussian":
            fit = select_gaussian(xs, yc, prior_inclusion, slab_scale, noise_scale, opts)
        else:
            fit = select_bernoulli(xs, yc, prior_inclusion, slab_scale, opts)
        budget = TIME_BUDGET if time_budget is None else time_budget
        if method == "mcmc" or (method == "auto" and not fit["khat"] <= KHAT_THRESHOLD):
            fit = refine(fit, xs, yc, family, opts, budget, noise_given=noise_given)
        elif method == "auto":
            fit = verify(fit, xs, yc, family, opts, budget, noise_given=noise_given)
    inclusion, capped = cap_probabilities(fit)
    if capped.size:
        fit["details"]["uncapped"] = np.asarray(fit["inclusion"], dtype=np.float64)
    prior_out, slab_out, noise_out = fit["hyper"]
    if family == "gaussian":  # back to the units of y
        slab_out, noise_out = math.ldexp(slab_out, k), math.ldexp(noise_out, k)
        if "noise_scale_mean" in fit["details"]:
            fit["details"]["noise_scale_mean"] = math.ldexp(fit["details"]["noise_scale_mean"], k)
        if "elbo" in fit["details"]:  # log p(y) = log p(y / 2**k) - n k log 2
            fit["details"]["elbo"] = [e - x.shape[0] * k * math.log(2.0) for e in fit["details"]["elbo"]]
    coefficients = np.ldexp(
        np.asarray(fit["coef"], dtype=np.float64) / x_scale.cpu().numpy(), k - x_exponent.cpu().numpy()
    )
    result = SelectionResult(
        inclusion_probabilities=inclusion,
        coefficients=coefficients,
        credible_sets=fit["sets"],
        khat=float(fit["khat"]),
        method=fit["method"],
        family=family,
        prior_inclusion=prior_out,
        slab_scale=slab_out,
        noise_scale=noise_out,
        variational_probabilities=np.asarray(fit["variational"], dtype=np.float64),
        feature_names=names,
        draws=np.asarray(fit["draws"]),
        log_weights=np.asarray(fit["log_weights"]),
        details=fit["details"],
        mcse=fit.get("mcse"),
        ess=fit.get("ess"),
        rhat=fit.get("rhat"),
        capped=capped,
        sampler=fit.get("sampler"),
    )
    if not result.reliable:
        warnings.warn(result.diagnostic, RuntimeWarning, stacklevel=3)
    return result
