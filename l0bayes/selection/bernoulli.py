r"""The Bernoulli family of :func:`~l0bayes.selection.select_variables`: the logistic fit and its importance check.

The mean-field hard concrete model (:class:`~l0bayes.models.SparseLogisticRegression`, Gaussian slab) is
fitted full batch until its free energy stabilises; its draws :math:`(z, \tilde\theta)` are reweighted to the
exact joint density (the mixed log-density of the gates, Eq. 26, and the slab), with Pareto :math:`\hat k`
as the diagnostic. The credible sets and the empirical-Bayes :math:`\pi_0` come from a sum of single effects
fitted to the centred labels.
"""

import math

import numpy as np
import torch

from ..distributions import kl_hard_concrete
from ..nn.gates import prior_like
from .importance import KHAT_THRESHOLD, psis
from .single_effects import credible_sets, fit_single_effects


def _logistic_free_energy(model, x, y):
    """One-sample estimate of the free energy (Eq. 21): NLL + gate KL (Eq. 28) + slab cost (Eq. 20)."""
    z = model.gate()
    noise = torch.randn_like(model.weight)
    theta = model.weight + model.slab_log_scale.exp() * noise
    logits = x @ (theta * z) + model.bias
    nll = torch.nn.functional.binary_cross_entropy_with_logits(logits, y, reduction="sum")
    gate_kl = kl_hard_concrete(model.gate.distribution(), prior_like(model.prior, model.weight)).sum()
    slab_cost = (model.gate.prob_nonzero() * model.slab_kl()).sum()  # the Gaussian slab's KL where a gate is open
    return nll + gate_kl + slab_cost


def _logistic_fit(xs, y, prior_inclusion, slab_scale, opts):
    """Full-batch Adam on the mean-field free energy until it stops improving.

    Every ``window`` steps the mean of the last ``window`` one-sample estimates is compared
    with the mean of the ``window`` before: the fit stops when, at two checks in a row, they
    differ by less than two standard errors of the difference (the objective has stabilised
    within its own noise) or by less than ``tol`` relative.
    """
    from ..models.regression import SparseLogisticRegression

    model = SparseLogisticRegression(
        xs.shape[1], prior_inclusion=prior_inclusion, slab="gaussian", prior_scale=slab_scale
    ).to(device=xs.device, dtype=xs.dtype)
    optim = torch.optim.Adam(model.parameters(), lr=opts["lr"])
    history, window, calm = [], 200, 0
    for step in range(1, opts["max_steps"] + 1):
        optim.zero_grad()
        loss = _logistic_free_energy(model, xs, y)
        loss.backward()
        optim.step()
        history.append(loss.item())
        if step >= 3 * window and step % window == 0:
            now, before = np.asarray(history[-window:]), np.asarray(history[-2 * window : -window])
            gap = abs(before.mean() - now.mean())
            se = math.sqrt((now.var() + before.var()) / window)
            calm = calm + 1 if gap < 2.0 * se or gap < opts["tol"] * (1.0 + abs(now.mean())) else 0
            if calm == 2:
                break
    return model, history


def _logistic_check(model, xs, y, slab_scale, num_draws, generator):
    """Importance weights of the guide's joint draws ``(z, theta)`` against the exact joint density."""
    from torch.distributions import Bernoulli, Normal

    with torch.no_grad():
        q_gate, prior = model.gate.distribution(), prior_like(model.prior, model.weight)
        z = q_gate.sample((num_draws,))
        mu, s = model.weight, model.slab_log_scale.exp()
        theta = mu + s * torch.randn(num_draws, mu.numel(), dtype=xs.dtype, device=xs.device, generator=generator)
        logits = (theta * z) @ xs.T + model.bias
        log_lik = Bernoulli(logits=logits).log_prob(y).sum(1)
        log_gate = (prior.log_prob(z) - q_gate.log_prob(z)).sum(1)
        slab = Normal(0.0, slab_scale).log_prob(theta) - Normal(mu, s).log_prob(theta)
        log_slab = torch.where(z != 0, slab, torch.zeros_like(slab)).sum(1)
        smoothed, khat = psis((log_lik + log_gate + log_slab).cpu().numpy())
        w = torch.as_tensor(np.exp(smoothed), dtype=xs.dtype, device=xs.device)
        draws = z != 0
        inclusion = (w @ draws.to(xs.dtype)).clamp(0.0, 1.0)  # a sum of normalised weights: above 1 by rounding only
        return khat, inclusion.cpu().numpy(), (w @ (theta * z)).cpu().numpy(), draws, smoothed


def _screening(xs, y, opts):
    r"""A sum of single effects fitted to the centred labels (a linear probability model): its credible sets, and
    the empirical-Bayes :math:`\pi_0` of the logistic model, its expected number of effects over :math:`p` (at most
    1/2).

    The sets group the features that carry one signal, as the Gaussian family's do: a group of correlated features
    explains the labels' linear part as it explains their logits.
    """
    p = xs.shape[1]
    fit = fit_single_effects(xs, y - y.mean(), num_effects=opts["num_effects"], tol=1e-3, max_iter=opts["max_iter"])
    sets, _ = credible_sets(xs, fit.alpha, fit.active)
    return min(max(float(fit.inclusion_probabilities().sum()), 1.0) / p, 0.5), sets


def select_bernoulli(xs, y, prior_inclusion, slab_scale, opts):
    r"""The logistic fit of :func:`~l0bayes.selection.select_variables` and its importance check.

    :param xs: ``(n, p)`` standardised tensor; ``y`` the 0/1 labels.
    :param prior_inclusion: :math:`\pi_0`, or ``None`` for that of the sum of single effects fitted to the centred
        labels; ``slab_scale``: :math:`\tau` in logits per standard deviation of a feature (``None``: 1).
    :param dict opts: the options of ``select_variables`` (``num_effects``, ``max_iter``, ``lr``, ``max_steps``,
        ``tol``, ``num_draws``, ``generator``).
    :returns: the fit's record, with the keys of :func:`~l0bayes.selection.gaussian.select_gaussian`'s (no
        ``gram``; ``hyper`` has ``nan`` for the noise scale).
    """
    screened, sets = _screening(xs, y, opts)
    prior_inclusion = screened if prior_inclusion is None else prior_inclusion
    slab_scale = 1.0 if slab_scale is None else slab_scale
    model, history = _logistic_fit(xs, y, prior_inclusion, slab_scale, opts)
    khat, inclusion, coef, draws, logw = _logistic_check(model, xs, y, slab_scale, opts["num_draws"], opts["generator"])
    variational = model.inclusion_probabilities().cpu().numpy()
    out = {"inclusion": inclusion, "coef": coef, "method": "reweighted"}
    if khat > KHAT_THRESHOLD:
        out = {"inclusion": variational, "coef": model.coefficients().cpu().numpy(), "method": "variational"}
    return {
        **out,
        "start": torch.as_tensor(variational, dtype=xs.dtype, device=xs.device),
        "variational": variational,
        "sets": sets,
        "khat": khat,
        "draws": draws.cpu().numpy(),
        "log_weights": logw,
        "hyper": (prior_inclusion, slab_scale, float("nan")),
        "details": {"steps": len(history), "free_energy": history},
    }
