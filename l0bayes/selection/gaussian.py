r"""The Gaussian family of :func:`~l0bayes.selection.select_variables`: the fit and its importance check.

A sum of single effects (:func:`~l0bayes.selection.fit_single_effects`) fitted to the standardised data gives
the empirical-Bayes prior where none is given and a product-Bernoulli proposal; adaptive importance sampling
(:func:`~l0bayes.selection.importance_check`) reweights its draws to the exact collapsed posterior, and the last
round's probabilities are Rao-Blackwellised (:func:`~l0bayes.selection.importance.conditional_inclusion`).
"""

import math

import numpy as np
import torch

from .importance import conditional_inclusion, importance_check
from .sampler.state import full_gram_pays
from .single_effects import credible_sets, fit_single_effects

CORE = 1e-3  # features below this probability are proposed as one exchangeable background block
MAX_CORE = 200  # and so are all but the MAX_CORE most probable ones


def _target_defaults(fit, pip, prior_inclusion, slab_scale, noise_scale):
    """Empirical-Bayes values of the target model's prior where the user gave none."""
    p = pip.numel()
    if noise_scale is None:
        noise_scale = math.sqrt(fit.noise_variance)
    if prior_inclusion is None:
        prior_inclusion = min(max(float(pip.sum()), 1.0) / p, 0.5)
    if slab_scale is None:
        coef = fit.coefficients()[pip > 0.5]
        slab_scale = float(coef.pow(2).mean().sqrt()) if coef.numel() else math.sqrt(float(fit.prior_variance.max()))
        slab_scale = max(slab_scale, 1e-3 * noise_scale)
    return float(prior_inclusion), float(slab_scale), float(noise_scale)


def _residual_inclusion(x, y, coef, prior_inclusion, slab_scale, noise_scale):
    r"""Probability that feature :math:`j` enters a model that already holds the fit, one at a time.

    With the residual :math:`r = y - X\bar b`, :math:`\hat\beta_j = x_j^\top r / d_j` and
    :math:`s_j^2 = \sigma^2 / d_j`: :math:`\pi_0 \mathrm{BF}_j / (1 - \pi_0 + \pi_0 \mathrm{BF}_j)`
    with the Bayes factor of the single-effect regression at :math:`V = \tau^2`. It gives the
    proposal the weak signals that the fit's effects left out.
    """
    d = (x * x).sum(0)
    bhat = (x.T @ (y - x @ coef)) / d
    s2 = noise_scale**2 / d
    lbf = 0.5 * torch.log(s2 / (slab_scale**2 + s2)) + 0.5 * bhat**2 * slab_scale**2 / (s2 * (slab_scale**2 + s2))
    return torch.sigmoid(lbf + math.log(prior_inclusion) - math.log1p(-prior_inclusion))


def _proposals(probs, p):
    """Two product-Bernoulli components and the core mask.

    The first is the probabilities clipped to ``[0.1/p, 1 - 0.1/p]``; the second, defensive,
    moves them towards 1/2 by ``1/p``, :math:`(a_j + 1/p) / (1 + 2/p)`: about one extra feature
    per draw for large ``p``, a visible flattening for small ``p``. Features below :data:`CORE`
    (and all but the :data:`MAX_CORE` most probable) are the exchangeable background of
    :class:`~l0bayes.selection.importance.BernoulliMixture`.
    """
    floor = 0.1 / p
    clipped = probs.clamp(floor, 1.0 - floor)
    flat = (clipped + 1.0 / p) / (1.0 + 2.0 / p)
    core = probs >= CORE
    if int(core.sum()) > MAX_CORE:
        core = torch.zeros_like(core)
        core[torch.topk(probs, MAX_CORE).indices] = True
    return torch.stack([clipped, flat]), core


def _reweight(x, y, pip, hyper, num_draws, rounds, generator, gram=None):
    r"""Adaptive importance sampling: round ``r + 1`` proposes from round ``r``'s reweighted probabilities.

    Stops at the first round with k-hat at most 0.7 and an effective sample size of at least a
    tenth of the draws. ``gram``: :math:`X^\top X` where it is computed once for the check and the sampler.
    """
    p = x.shape[1]
    probs, check = pip, None
    for _ in range(rounds):
        proposals, core = _proposals(probs, p)
        check = importance_check(
            x, y, proposals, *hyper, num_draws=num_draws, generator=generator, core=core, rao_blackwell=False, gram=gram
        )
        if check.reliable and check.ess >= 0.1 * num_draws:
            break
        # the next round adapts the core features only: a background feature's estimate rests on
        # the few draws that happened to include it
        probs = torch.where(core, torch.as_tensor(check.inclusion, dtype=x.dtype, device=x.device), pip)
    draws = torch.as_tensor(check.draws, device=x.device)
    weights = torch.as_tensor(np.exp(check.log_weights), dtype=x.dtype, device=x.device)
    check.inclusion = conditional_inclusion(x, y, draws, weights, *hyper, gram=gram).cpu().numpy()
    return check


def select_gaussian(xs, yc, prior_inclusion, slab_scale, noise_scale, opts):
    r"""The Gaussian fit of :func:`~l0bayes.selection.select_variables` and its importance check.

    :param xs: ``(n, p)`` standardised tensor; ``yc`` the centred, scaled response.
    :param prior_inclusion: :math:`\pi_0`, or ``None`` for its empirical-Bayes value (likewise ``slab_scale`` and
        ``noise_scale``, in the units of ``yc``).
    :param dict opts: the options of ``select_variables`` (``num_effects``, ``tol``, ``max_iter``, ``rounds``,
        ``num_draws``, ``generator``).
    :returns: the fit's record, a dict: ``inclusion``, ``coef`` and ``method`` (``"reweighted"`` where the check
        passed, else the fit's own, ``"variational"``), ``start`` (the sampler's starting probabilities),
        ``variational``, ``sets`` (credible sets), ``khat``, ``draws`` and ``log_weights`` (the check's),
        ``hyper`` (the target model's :math:`(\pi_0, \tau, \sigma)`), ``details`` and ``gram`` (:math:`X^\top X`
        or ``None``).
    """
    fit = fit_single_effects(
        xs,
        yc,
        num_effects=opts["num_effects"],
        noise_variance=None if noise_scale is None else noise_scale**2,
        tol=opts["tol"],
        max_iter=opts["max_iter"],
    )
    pip = fit.inclusion_probabilities()
    hyper = _target_defaults(fit, pip, prior_inclusion, slab_scale, noise_scale)
    sets, effects = credible_sets(xs, fit.alpha, fit.active)
    # The proposal uses only the effects with a credible set: a diffuse effect (a tiny prior
    # variance spread over every feature) would only add random features to each draw.
    kept = fit.active.clone()
    if effects:
        kept[:] = False
        kept[effects] = True
    start = -torch.expm1(torch.log1p(-fit.alpha[kept]).sum(0))
    start = torch.maximum(start, _residual_inclusion(xs, yc, fit.coefficients(), *hyper))
    # X^T X once, for the check, its Rao-Blackwellised probabilities and the sampler, where the sampler would use it
    gram = xs.T @ xs if full_gram_pays(*xs.shape) else None
    check = _reweight(xs, yc, start, hyper, opts["num_draws"], opts["rounds"], opts["generator"], gram)
    variational = pip.cpu().numpy()
    out = {"inclusion": check.inclusion, "coef": check.coef_mean, "method": "reweighted"}
    if not check.reliable:
        out = {"inclusion": variational, "coef": fit.coefficients().cpu().numpy(), "method": "variational"}
    details = {
        "num_effects": int(fit.alpha.shape[0]),
        "active_effects": int(fit.active.sum()),
        "elbo": fit.elbo,
        "converged": fit.converged,
        "ess": check.ess,
        "max_shift": check.max_shift,
    }
    return {
        **out,
        "start": start,
        "variational": variational,
        "sets": sets,
        "khat": check.khat,
        "draws": check.draws,
        "log_weights": check.log_weights,
        "hyper": hyper,
        "details": details,
        "gram": gram,
    }
