r"""The exact sampler's part in :func:`~l0bayes.selection.select_variables`: :func:`refine` and :func:`verify`.

``method="mcmc"``, and ``"auto"`` where the importance check fails, return :func:`refine`'s answer: weighted
tempered Gibbs sampling (:func:`~l0bayes.selection.tempered_gibbs`) of the exact posterior of the fit's target
model, started from the fit. Where the check passes, ``"auto"`` tests it with :func:`verify`: a short run of the
same sampler, and the full run's answer where the two disagree.
"""

import numpy as np

from .sampler.gibbs import tempered_gibbs
from .sampler.run_length import RunLength

MCMC_WARMUP = 500  # warm-up steps per chain of the sampler's runs (but the short test of a passed check)
AGREE = 0.2  # a passed check is confirmed when no probability differs from the sampler's by more than this
VERIFY_WARMUP, VERIFY_STEPS = 50, 150  # the test of a passed check: a short run per chain (a full one if it fails)


def refine(fit, xs, y, family, opts, time_budget, noise_given, warmup=MCMC_WARMUP, diagnose=True):
    r"""Weighted tempered Gibbs sampling of the exact posterior of the fit's target model, started from the fit.

    Gaussian family without a given ``noise_scale``: :math:`\sigma` is sampled too (Jeffreys prior,
    started at the fit's estimate), since the fit's estimate is least reliable where its check fails.

    :param dict fit: the record of a family's fit (:func:`~l0bayes.selection.gaussian.select_gaussian`,
        :func:`~l0bayes.selection.bernoulli.select_bernoulli`): its ``hyper``, ``start`` and ``gram`` are used.
    :param xs: ``(n, p)`` standardised tensor; ``y`` the standardised response (or the 0/1 labels).
    :param dict opts: :func:`~l0bayes.selection.select_variables`' options (``num_chains``, ``mcmc_steps``,
        ``generator``).
    :param float time_budget: seconds at most.
    :param bool noise_given: whether the user fixed ``noise_scale`` (else the sampler draws it).
    :param int warmup: warm-up steps per chain.
    :param bool diagnose: as in :func:`~l0bayes.selection.tempered_gibbs`.
    :returns: the record with the sampler's probabilities, coefficients and diagnostics, ``method="mcmc"`` and
        the run itself under ``"sampler"``.
    """
    prior_inclusion, slab_scale, noise_scale = fit["hyper"]
    sample_noise = family == "gaussian" and not noise_given
    run = tempered_gibbs(
        xs,
        y,
        prior_inclusion,
        slab_scale,
        noise_scale if family == "gaussian" else None,
        family=family,
        start=fit["start"],
        num_chains=opts["num_chains"],
        run_length=RunLength(warmup=warmup, max_steps=opts["mcmc_steps"], time_budget=time_budget),
        noise_prior="jeffreys" if sample_noise else None,
        generator=opts["generator"],
        gram=fit.get("gram"),
        diagnose=diagnose,
    )
    details = {**fit["details"], "sampler_steps": run.num_steps, "sampler_seconds": run.seconds, **run.details}
    hyper = fit["hyper"]
    if sample_noise:
        hyper = (prior_inclusion, slab_scale, run.details["noise_scale_mean"])
        details["noise_prior"] = "jeffreys"
    return {
        **fit,
        "hyper": hyper,
        "inclusion": run.inclusion,
        "coef": run.coef_mean,
        "method": "mcmc",
        "mcse": run.mcse,
        "ess": run.ess,
        "rhat": run.rhat,
        "sampler": run,
        "details": details,
    }


def verify(fit, xs, y, family, opts, budget, noise_given):
    r"""A passed check, tested by a short run of the sampler started from the fit.

    Pareto :math:`\hat k` only sees the states the fit proposes: a fit that misses a mode entirely can pass it.
    The sampler, started from the fit, finds such a mode. Where every probability of the checked fit lies within
    :data:`AGREE` (plus twice its Monte Carlo error) of the short run's (:data:`VERIFY_STEPS` steps per chain),
    the checked fit stands; else the answer of a full run is returned.

    The arguments are those of :func:`refine` (``budget`` its ``time_budget``). Returns the fit with
    ``details["verified"]``, or the full run's record with ``details["check_contradicted"]``.
    """
    short = {**opts, "mcmc_steps": min(opts["mcmc_steps"], VERIFY_STEPS)}
    run = refine(fit, xs, y, family, short, budget, noise_given, warmup=VERIFY_WARMUP, diagnose=False)
    gap = np.abs(np.asarray(run["inclusion"]) - np.asarray(fit["inclusion"]))
    excess = gap - AGREE  # the Monte Carlo errors only matter where a gap exceeds AGREE (they are never negative)
    if (excess > 0).any():
        excess = excess - 2 * np.nan_to_num(run["sampler"].diagnose().mcse)
    verdict = {
        "max_gap": float(gap.max()),
        "feature": int(np.argmax(excess)),
        "steps": run["sampler"].num_steps,
        "seconds": run["sampler"].seconds,
    }
    if not (excess > 0).any():
        fit["details"]["verified"] = verdict
        return fit
    # the fit missed mass: the sampler's answer, from a full run (the short one has few draws)
    left = max(budget - verdict["seconds"], 0.1 * budget)
    full = refine(fit, xs, y, family, opts, left, noise_given)
    full["details"]["check_contradicted"] = verdict
    return full
