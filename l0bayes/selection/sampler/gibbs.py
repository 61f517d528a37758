r"""Exact inclusion probabilities by weighted tempered Gibbs sampling of the collapsed spike-and-slab posterior.

The sampler of Zanella & Roberts (2019, "Scalable importance tempering and Bayesian variable
selection", JRSS-B 81), *weighted tempered Gibbs sampling* (wTGS, their Section 4), on the
inclusion indicators :math:`\gamma \in \{0, 1\}^p` with the coefficients integrated out.

**Gaussian family.** The model of :mod:`l0bayes.selection.exact` (centred data, known
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
    \begin{gathered}
    \log \mathrm{BF}_j = -\tfrac12 \log \tau^2 - \tfrac12 \log s_j + \frac{r_j^2}{2 s_j},\\
    s_j = x_j^\top W x_j + \tau^{-2} - g_j^\top A^{-1} g_j,\quad r_j = u_j - g_j^\top \hat b,
    \end{gathered}

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

How long the chains run is a :class:`~l0bayes.selection.sampler.run_length.RunLength`. The state of the chains and
its rank-one updates are in :mod:`l0bayes.selection.sampler.state`; the result, its R-hat, ESS and Monte Carlo
standard errors in :mod:`l0bayes.selection.sampler.diagnostics`.
"""

import math
import time

import numpy as np
import torch

from ...distributions.polya_gamma import polya_gamma_mean, sample_polya_gamma
from .diagnostics import RELEVANT, BlockSums, StateSnapshots, chain_result
from .run_length import RunLength
from .state import ChainState, check_gram

# noise_prior="jeffreys": a draw of sigma below this fraction of y's standard deviation means that the chain's model
# fits y exactly, where the posterior of sigma under p(sigma^2) = 1/sigma^2 is improper (it has no mass elsewhere)
NOISE_FLOOR = 1e-6


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


def tempered_gibbs(
    x,
    y,
    prior_inclusion,
    slab_scale,
    noise_scale=None,
    family="gaussian",
    start=None,
    num_chains=4,
    run_length=None,
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
    :param run_length: how long to sample, a :class:`~l0bayes.selection.sampler.run_length.RunLength`: the warm-up,
        the least and most steps per chain after it, how often convergence is checked and the time budget
        (``None``: ``RunLength()``, 500 warm-up steps, then 1,000 to 100,000 steps per chain, stopping at the
        first check, every 1,000 steps, where the chains have mixed).
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
    :param thin: keep every ``thin``-th state for ``TemperedGibbsResult.states`` at first; the
        interval doubles whenever 2000 are kept, so 1000 to 2000 remain per chain.
    :param gram: Gaussian: :math:`X^\top X` (``(p, p)``) where the caller already has it; used where the
        sampler would compute it (:func:`~l0bayes.selection.sampler.state.full_gram_pays`), ignored otherwise.
    :param bool diagnose: compute R-hat, ESS and the MCSE of each probability at the end; ``False`` leaves them
        ``None`` until :meth:`~l0bayes.selection.sampler.diagnostics.TemperedGibbsResult.diagnose` is called (a
        short run read for its probabilities).
    :returns: :class:`~l0bayes.selection.sampler.diagnostics.TemperedGibbsResult`.
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
    if num_chains < 1:
        raise ValueError(f"need num_chains >= 1, got {num_chains}")
    if run_length is None:
        run_length = RunLength()
    elif not isinstance(run_length, RunLength):
        raise TypeError(
            "run_length must be a RunLength (from l0bayes.selection), e.g. RunLength(warmup=500, max_steps=100_000), "
            f"or None, got {type(run_length).__name__} {run_length!r}"
        )
    warmup, max_steps, min_steps = run_length.warmup, run_length.max_steps, run_length.min_steps
    check_every, time_budget = run_length.check_every, run_length.time_budget
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
        state = ChainState(x, u, 1.0 / slab_scale**2, 1.0 / intercept_scale**2, 1, None, omega, 16)
    else:
        prec = torch.full((C,), 1.0 / noise_scale**2, dtype=dtype, device=device)
        u = torch.cat([x.T @ y, y.new_zeros(1)])
        state = ChainState(x, u, 1.0 / slab_scale**2, 1.0, 0, prec, None, 16, gram=check_gram(gram, x))
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
    acc = {"pip": BlockSums(), "w": BlockSums(), "coef": BlockSums()}
    snapshots = StateSnapshots(C, p, dtype, device, thin or 1)
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
            if chain_result(acc, snapshots, done, warmup, began, omega_moves, C, RELEVANT).mixed:
                stopped = "mixed"
                break
    result = chain_result(acc, snapshots, max(step - warmup, 0), warmup, began, omega_moves, C, RELEVANT / 10, diagnose)
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
