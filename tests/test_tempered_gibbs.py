"""The weighted tempered Gibbs sampler and the Pólya-Gamma draws, against references that share no code with them.

References: l0bayes.selection.exact_inclusion_probabilities (enumeration of all 2^p Gaussian models,
itself tested against quadrature), adaptive Gauss-Hermite quadrature of the logistic model's
marginal likelihood (tests/exact_spike_slab.py), the closed-form Pólya-Gamma moments and the
compiled ``polyagamma`` package. Tolerances come from the sampler's own Monte Carlo standard errors.
"""

import dataclasses
import itertools
import math

import numpy as np
import pytest
import torch
from exact_spike_slab import logistic_inclusion_quadrature
from scipy.special import expit, logsumexp
from scipy.stats import ks_2samp

from l0bayes.distributions.polya_gamma import polya_gamma_mean, sample_polya_gamma
from l0bayes.selection import RunLength, TemperedGibbsResult, exact_inclusion_probabilities, tempered_gibbs

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")


def ar1(n, p, rho, rng):
    x = np.empty((n, p))
    x[:, 0] = rng.standard_normal(n)
    for j in range(1, p):
        x[:, j] = rho * x[:, j - 1] + math.sqrt(1 - rho**2) * rng.standard_normal(n)
    return (x - x.mean(0)) / x.std(0, ddof=1)


def within_mcse(estimate, mcse, exact, k=5.0, floor=0.01):
    """|estimate - exact| <= k MCSE + floor, feature by feature (the floor covers the MCSE's own error)."""
    err = np.abs(estimate - exact)
    bad = ~(err <= k * mcse + floor)  # nan fails
    assert not bad.any(), f"errors {err[bad]} against MCSE {mcse[bad]} at features {np.flatnonzero(bad)}"


# ------------------------------------------------------------------ Pólya-Gamma
@pytest.mark.parametrize("c", [0.0, 0.7, 3.0, 25.0])
def test_polya_gamma_mean_and_variance(c):
    num = 100_000
    draws = sample_polya_gamma(torch.full((num,), c, dtype=torch.float64), torch.Generator().manual_seed(1))
    var = 1.0 / 24.0 if c == 0 else (math.sinh(c) - c) / (4 * c**3 * math.cosh(c / 2) ** 2)
    mean = polya_gamma_mean(torch.tensor([c], dtype=torch.float64)).item()
    assert mean == pytest.approx(0.25 if c == 0 else math.tanh(c / 2) / (2 * c), rel=1e-12)
    assert draws.mean().item() == pytest.approx(mean, abs=5 * math.sqrt(var / num))
    assert draws.var().item() == pytest.approx(var, rel=0.05)
    assert (draws > 0).all()


def test_polya_gamma_matches_the_compiled_sampler():
    polyagamma = pytest.importorskip("polyagamma")
    rng = np.random.default_rng(0)
    for c in (0.0, 1.3, 7.0):
        ours = sample_polya_gamma(torch.full((20_000,), c, dtype=torch.float64), torch.Generator().manual_seed(2))
        theirs = polyagamma.random_polyagamma(1, np.full(20_000, c), random_state=rng)
        assert ks_2samp(ours.numpy(), theirs).pvalue > 1e-3


def test_polya_gamma_bad_input():
    with pytest.raises(TypeError, match="floating-point"):
        sample_polya_gamma(torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="finite"):
        sample_polya_gamma(torch.tensor([1.0, math.nan]))


# ------------------------------------------------------------------ the sampler against exact answers
@pytest.fixture(scope="module")
def correlated_gaussian():
    rng = np.random.default_rng(11)
    x = ar1(150, 10, 0.9, rng)
    y = x[:, 2] - x[:, 5] + 0.6 * x[:, 8] + rng.standard_normal(150)
    y = y - y.mean()
    return x, y, exact_inclusion_probabilities(x, y, 0.2, 0.5, 1.0)


@pytest.mark.parametrize("kernel", ["wtgs", pytest.param("gibbs", marks=pytest.mark.slow)])
def test_gaussian_sampler_matches_enumeration(correlated_gaussian, kernel):
    x, y, exact = correlated_gaussian
    assert (
        exact.inclusion.max() - exact.inclusion.min() > 0.5
        and ((exact.inclusion > 0.2) & (exact.inclusion < 0.8)).any()
    )
    run = tempered_gibbs(
        torch.tensor(x),
        torch.tensor(y),
        0.2,
        0.5,
        1.0,
        kernel=kernel,
        run_length=RunLength(min_steps=2000, max_steps=2000),
        generator=torch.Generator().manual_seed(0),
    )
    assert run.num_steps == 2000 and run.chain_inclusion.shape == (4, 10)
    assert np.all(run.mcse < 0.03) and np.all(np.isfinite(run.rhat[exact.inclusion > 0.01]))
    within_mcse(run.inclusion, run.mcse, exact.inclusion)
    np.testing.assert_allclose(run.coef_mean, exact.coef_mean, atol=0.03)


def test_gram_columns_as_needed_give_the_whole_gram_matrix_answer(correlated_gaussian, monkeypatch):
    """Above FULL_GRAM_MAX features the Gram columns are computed as the chains first need them: the same
    chains (the same random stream, the same decisions), up to rounding."""
    import l0bayes.selection.sampler.state as tg

    x, y, exact = correlated_gaussian
    runs = []
    for limit in (tg.FULL_GRAM_MAX, 0):
        monkeypatch.setattr(tg, "FULL_GRAM_MAX", limit)
        args = (torch.tensor(x), torch.tensor(y), 0.2, 0.5, 1.0)
        # (a short warm-up: the chains are compared with each other, step by step)
        gen = torch.Generator().manual_seed(3)
        runs.append(
            tempered_gibbs(*args, run_length=RunLength(warmup=100, min_steps=300, max_steps=300), generator=gen)
        )
    np.testing.assert_allclose(runs[0].inclusion, runs[1].inclusion, rtol=1e-9, atol=1e-12)
    assert np.abs(runs[0].inclusion - exact.inclusion).max() < 0.2


def test_a_given_gram_matrix_is_read_instead_of_computed(correlated_gaussian):
    """``gram=X^T X`` gives the chains of a run that computes it; a different matrix changes them (it is read)."""
    x, y, _ = correlated_gaussian
    xt, yt = torch.tensor(x), torch.tensor(y)
    gram = xt.T @ xt
    other = 0.5 * gram + 0.5 * torch.diag(torch.diagonal(gram))  # the same diagonal, weaker correlations
    # (a short warm-up: the chains are compared with each other, step by step)
    short = RunLength(warmup=100, min_steps=200, max_steps=200)
    runs = [
        tempered_gibbs(xt, yt, 0.2, 0.5, 1.0, run_length=short, generator=torch.Generator().manual_seed(3), gram=g)
        for g in (None, gram, other)
    ]
    np.testing.assert_allclose(runs[1].inclusion, runs[0].inclusion, rtol=1e-10, atol=1e-13)
    assert np.abs(runs[2].inclusion - runs[0].inclusion).max() > 0.01


def test_state_prior_precisions_are_exact_in_float64():
    """The intercept's precision in the always-included slot, 1 / tau^2 in the others, without float32 rounding."""
    from l0bayes.selection.sampler.state import ChainState as _State

    x = torch.randn(20, 5, dtype=torch.float64)
    u = torch.zeros(7, dtype=torch.float64)
    omega = torch.ones(2, 20, dtype=torch.float64)
    state = _State(x, u, 1.0 / 0.3**2, 1.0 / 10.0**2, 1, None, omega, 8)
    out = state.prior_precision(torch.tensor([0, 1, 3]))
    assert out.dtype == torch.float64
    assert out.tolist() == [1.0 / 10.0**2, 1.0 / 0.3**2, 1.0 / 0.3**2]


def test_the_whole_gram_matrix_only_where_it_pays():
    """X^T X is computed whole up to FULL_GRAM_MAX columns and FULL_GRAM_FLOPS multiply-adds, not beyond."""
    from l0bayes.selection.sampler.state import FULL_GRAM_FLOPS, FULL_GRAM_MAX, full_gram_pays

    assert full_gram_pays(1000, 1000) and full_gram_pays(1, FULL_GRAM_MAX)
    assert not full_gram_pays(1, FULL_GRAM_MAX + 1)
    p = 1000
    n = int(FULL_GRAM_FLOPS // p**2)
    assert full_gram_pays(n, p) and not full_gram_pays(n + 1, p)


def test_a_given_gram_matrix_is_checked(correlated_gaussian):
    x, y, _ = correlated_gaussian
    xt, yt = torch.tensor(x), torch.tensor(y)
    for bad in (xt.T @ xt[:, :5], (xt.T @ xt).float(), "X^T X"):
        with pytest.raises(ValueError, match="gram must be X\\^T X"):
            tempered_gibbs(xt, yt, 0.2, 0.5, 1.0, run_length=RunLength(max_steps=10), gram=bad)


def test_diagnostics_on_demand_equal_those_of_the_run():
    """``diagnose=False`` leaves R-hat, ESS and MCSE for later; :meth:`diagnose` then gives the values a
    ``diagnose=True`` run of the same chains computes."""
    rng = np.random.default_rng(5)
    x = ar1(60, 8, 0.7, rng)
    y = x[:, 1] - 0.8 * x[:, 6] + rng.standard_normal(60)
    args = (torch.tensor(x), torch.tensor(y - y.mean()), 0.3, 1.0, 1.0)
    runs = [
        tempered_gibbs(
            *args,
            run_length=RunLength(warmup=100, min_steps=400, max_steps=400),
            generator=torch.Generator().manual_seed(2),
            diagnose=d,
        )
        for d in (True, False)
    ]
    lazy = runs[1]
    assert lazy.rhat is None and lazy.mcse is None and lazy.ess is None
    np.testing.assert_array_equal(lazy.inclusion, runs[0].inclusion)
    assert lazy.diagnose() is lazy
    for name in ("rhat", "mcse", "ess"):
        np.testing.assert_array_equal(getattr(lazy, name), getattr(runs[0], name))
    assert lazy.mixed == runs[0].mixed
    assert lazy._blocks is None and runs[0]._blocks is None  # the block sums are released once used
    fresh = dataclasses.replace(lazy, rhat=None, mcse=None, ess=None)
    with pytest.raises(ValueError, match="no block sums"):
        fresh.diagnose()


def test_noise_moves_from_the_whole_gram_matrix_follow_the_same_chains(monkeypatch):
    """sigma sampled: with the whole Gram matrix the residual sum of squares comes from it in O(k^2) and a new
    sigma reads its Gram rows from the cached matrix; without it both come from X. The same random stream must
    give the same chains up to rounding."""
    import l0bayes.selection.sampler.state as tg

    rng = np.random.default_rng(4)
    x = ar1(80, 9, 0.8, rng)
    y = 0.9 * x[:, 2] - 0.7 * x[:, 5] + rng.standard_normal(80)
    runs = []
    for limit in (tg.FULL_GRAM_MAX, 0):
        monkeypatch.setattr(tg, "FULL_GRAM_MAX", limit)
        args = (torch.tensor(x), torch.tensor(y - y.mean()), 0.3, 0.8, 2.0)
        gen = torch.Generator().manual_seed(1)
        # (a short warm-up: the chains are compared with each other, step by step)
        runs.append(
            tempered_gibbs(
                *args,
                noise_prior="jeffreys",
                run_length=RunLength(warmup=100, min_steps=400, max_steps=400),
                generator=gen,
            )
        )
    assert runs[0].details["omega_fraction"] > 0.1  # sigma moved often
    np.testing.assert_allclose(runs[0].inclusion, runs[1].inclusion, rtol=1e-8, atol=1e-11)
    assert runs[0].details["noise_scale_mean"] == pytest.approx(runs[1].details["noise_scale_mean"], rel=1e-8)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("exact_fit", [False, True])
def test_residual_sum_of_squares_from_the_gram_matrix(dtype, exact_fit):
    """The O(k^2) residual sum of squares against ||y - X_gamma b||^2 of the same draw of b, including a model
    that explains y almost exactly (there the expansion cancels and the residual itself is used)."""
    from l0bayes.selection.sampler.state import ChainState as _State

    # exact_fit: R^2 = 1 - 1e-4 (float32) or 1 - 1e-10 (float64), past half the digits of the dtype
    noise = (1e-2 if dtype == torch.float32 else 1e-5) if exact_fit else 1.0
    rng = np.random.default_rng(0)
    x = torch.tensor(ar1(50, 6, 0.5, rng), dtype=dtype)
    y = x[:, 1] - 0.5 * x[:, 4] + noise * torch.tensor(rng.standard_normal(50), dtype=dtype)
    y = y - y.mean()
    prec = torch.tensor([1.0 / noise**2], dtype=dtype)
    state = _State(x, torch.cat([x.T @ y, y.new_zeros(1)]), 1.0, 1.0, 0, prec, None, 16)
    assert state.full_gram
    gamma = torch.zeros(1, 6, dtype=torch.bool)
    gamma[0, [1, 4]] = True
    state.start(gamma)
    fast = state.residual_sum_of_squares(0, y, torch.Generator().manual_seed(2))
    b_psi = state.draw_coefficients(0, torch.Generator().manual_seed(2))  # the same draw of b: X_gamma b
    direct = ((y - b_psi) ** 2).sum()
    np.testing.assert_allclose(float(fast), float(direct), rtol=1e-4 if dtype == torch.float32 else 1e-9)
    assert fast > 0
    assert (direct / state.yy < torch.finfo(dtype).eps ** 0.5) == exact_fit  # the case meant


def test_noise_precision_update_matches_the_closed_form():
    """After a new sigma, A^-1, the Gram rows, q, d and u equal their closed forms at the new precision,
    computed from X directly (numpy): A = X_g^T X_g / sigma^2 + I / tau^2, Gt = X_g^T X / sigma^2,
    q_j = Gt_j^T A^-1 Gt_j, d_j = |x_j|^2 / sigma^2, u = X^T y / sigma^2."""
    from l0bayes.selection.sampler.state import ChainState as _State

    rng = np.random.default_rng(3)
    x = torch.tensor(ar1(40, 7, 0.7, rng))
    y = x[:, 0] + torch.tensor(rng.standard_normal(40))
    y = y - y.mean()
    lam = 2.0
    state = _State(
        x, torch.cat([x.T @ y, y.new_zeros(1)]), lam, 1.0, 0, torch.tensor([1.0, 0.5], dtype=x.dtype), None, 16
    )
    gamma = torch.zeros(2, 7, dtype=torch.bool)
    gamma[0, [0, 3, 6]] = True
    gamma[1, [2]] = True
    state.start(gamma)
    prec = 3.7
    state.set_noise_precision(0, torch.tensor(prec, dtype=torch.float64))
    xn, yn = x.numpy(), y.numpy()
    pos, cols = [int(k) for k in state.slots(0)[0]], [int(j) for j in state.slots(0)[1]]
    assert sorted(cols) == [0, 3, 6]
    xg = xn[:, cols]
    ainv = np.linalg.inv(prec * xg.T @ xg + lam * np.eye(3))
    gt = prec * xg.T @ xn
    np.testing.assert_allclose(state.ainv[0][np.ix_(pos, pos)].numpy(), ainv, rtol=1e-10)
    np.testing.assert_allclose(state.Gt[0, pos].numpy(), gt, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(state.q[0].numpy(), np.einsum("kj,kl,lj->j", gt, ainv, gt), rtol=1e-10)
    np.testing.assert_allclose(state.d[0].numpy(), prec * (xn**2).sum(0), rtol=1e-12)
    np.testing.assert_allclose(state.u[0, :7].numpy(), prec * xn.T @ yn, rtol=1e-12, atol=1e-12)
    assert float(state.noise_precision[0]) == prec and float(state.noise_precision[1]) == 0.5
    empty = [k for k in range(state.capacity) if k not in pos]  # the empty slots stay zero
    assert not state.ainv[0][empty].any() and not state.Gt[0, empty].any()


def test_one_step_of_warm_up():
    """The adaptation of the auxiliary coordinate's weight has at least one value to average."""
    rng = np.random.default_rng(0)
    x = ar1(30, 4, 0.3, rng)
    y = x[:, 0] + rng.standard_normal(30)
    run = tempered_gibbs(
        torch.tensor(x),
        torch.tensor(y - y.mean()),
        0.3,
        1.0,
        1.0,
        noise_prior="jeffreys",
        run_length=RunLength(warmup=1, max_steps=5),
    )
    assert run.num_steps == 5


def test_gaussian_sampler_with_unknown_noise_matches_enumeration():
    """sigma sampled under p(sigma^2) = 1/sigma^2: against enumeration with sigma^2 integrated out on a grid."""
    from l0bayes.selection.exact import log_marginal_likelihood

    rng = np.random.default_rng(12)
    x = ar1(60, 7, 0.8, rng)
    y = 0.8 * x[:, 1] - 0.6 * x[:, 6] + 1.5 * rng.standard_normal(60)
    y = y - y.mean()
    # sigma^2 from 0.1 to 15 (y has variance ~3): the posterior of log sigma^2 is smooth, about 0.2 wide, and a sum
    # on 60 points (0.08 apart) gives the same probabilities as on 200 to 8 digits
    log_s2 = np.linspace(math.log(0.1), math.log(15.0), 60)
    models = np.array(list(itertools.product([False, True], repeat=7)))
    log_ml = np.array(
        [
            logsumexp([log_marginal_likelihood(x, y, m, 0.7, math.exp(0.5 * t)) for t in log_s2])  # d(log s2) = ds2/s2
            for m in models
        ]
    )
    size = models.sum(1)
    log_post = log_ml + size * math.log(0.25) + (7 - size) * math.log(0.75)
    exact = np.exp(log_post - logsumexp(log_post)) @ models
    run = tempered_gibbs(
        torch.tensor(x),
        torch.tensor(y),
        0.25,
        0.7,
        3.0,  # a poor start: the true sigma is 1.5
        noise_prior="jeffreys",
        run_length=RunLength(min_steps=2000, max_steps=2000),
        generator=torch.Generator().manual_seed(0),
    )
    within_mcse(run.inclusion, run.mcse, exact)
    assert 1.2 < run.details["noise_scale_mean"] < 1.9 and 0.1 < run.details["omega_fraction"] < 0.3


def test_bernoulli_sampler_matches_quadrature():
    rng = np.random.default_rng(3)
    x = ar1(100, 4, 0.8, rng)
    y = (rng.random(100) < expit(0.3 + 0.9 * x[:, 1] - 0.6 * x[:, 3])).astype(float)
    exact = logistic_inclusion_quadrature(x, y, 0.3, 1.0, 10.0, points=8)
    run = tempered_gibbs(
        torch.tensor(x),
        torch.tensor(y),
        0.3,
        1.0,
        family="bernoulli",
        intercept_scale=10.0,
        run_length=RunLength(warmup=300, min_steps=1500, max_steps=1500),
        generator=torch.Generator().manual_seed(0),
    )
    assert 0.1 < run.details["omega_fraction"] < 0.3
    within_mcse(run.inclusion, run.mcse, exact)


@pytest.mark.slow
@pytest.mark.parametrize("polya_gamma", ["torch", "polyagamma"])
def test_bernoulli_sampler_matches_quadrature_long(polya_gamma):
    if polya_gamma == "polyagamma":
        pytest.importorskip("polyagamma")
    rng = np.random.default_rng(4)
    x = ar1(150, 4, 0.9, rng)
    y = (rng.random(150) < expit(-0.5 + 0.8 * x[:, 0] + 0.5 * x[:, 2])).astype(float)
    exact = logistic_inclusion_quadrature(x, y, 0.5, 0.8, 5.0, points=10)
    run = tempered_gibbs(
        torch.tensor(x),
        torch.tensor(y),
        0.5,
        0.8,
        family="bernoulli",
        intercept_scale=5.0,
        run_length=RunLength(min_steps=20_000, max_steps=20_000),
        polya_gamma=polya_gamma,
        generator=torch.Generator().manual_seed(5),
    )
    within_mcse(run.inclusion, run.mcse, exact, k=4.0, floor=0.005)


def test_steps_to_mix_scales_the_steps_by_the_failing_criteria():
    """R-hat^2 - 1 and 1/ESS fall as 1/steps: the steps that would mix are the run's, scaled by the worst ratio."""

    def run(rhat, ess):
        return TemperedGibbsResult(
            inclusion=np.array([0.5, 0.3, 0.2, 0.001]),
            mcse=np.zeros(4),
            ess=np.array(ess, dtype=float),
            rhat=np.array(rhat, dtype=float),
            coef_mean=np.zeros(4),
            chain_inclusion=np.zeros((4, 4)),
            states=[],
            state_log_weights=np.zeros((4, 0)),
            num_steps=1000,
        )

    # feature 1 fails ESS (twice too few), feature 2 R-hat; feature 3 is below 0.01 and does not count
    assert run([1.0, 1.005, 1.05, math.nan], [400, 50, 1e4, 1]).steps_to_mix() == math.ceil(
        1000 * (1.05**2 - 1) / (1.01**2 - 1)
    )
    assert run([1.0, 1.005, 1.0, math.nan], [400, 50, 1e4, 1]).steps_to_mix() == 2000
    assert run([1.0, 1.005, 1.0, 3.0], [400, 100, 1e4, 1]).steps_to_mix() == 1000  # mixed: its own steps
    assert run([1.0, math.nan, 1.0, 1.0], [400, 50, 1e4, 1]).steps_to_mix() is None  # a failing R-hat not computed


def test_sampler_stops_when_mixed_and_on_time():
    rng = np.random.default_rng(5)
    x = ar1(100, 8, 0.5, rng)
    y = x[:, 0] + rng.standard_normal(100)
    args = (torch.tensor(x), torch.tensor(y - y.mean()), 0.2, 1.0, 1.0)
    # (a short warm-up and minimum: what is checked is that the run ends where its chains mix, here at 1,000 steps)
    until_mixed = RunLength(warmup=100, min_steps=300, max_steps=50_000)
    easy = tempered_gibbs(*args, run_length=until_mixed, generator=torch.Generator().manual_seed(0))
    assert easy.details["stopped"] == "mixed" and easy.num_steps < 50_000 and easy.mixed
    # the budget can end the run only after the warm-up: a short one, so that a loaded machine cannot make the
    # warm-up alone outlast the bound below
    quick = tempered_gibbs(
        *args,
        run_length=RunLength(warmup=10, max_steps=10**7, time_budget=0.3),
        generator=torch.Generator().manual_seed(0),
    )
    assert quick.details["stopped"] == "time" and quick.seconds < 5.0


def test_sampler_bad_arguments():
    x, y = torch.randn(20, 3, dtype=torch.float64), torch.randn(20, dtype=torch.float64)
    with pytest.raises(ValueError, match="family"):
        tempered_gibbs(x, y, 0.5, 1.0, 1.0, family="poisson")
    with pytest.raises(ValueError, match="kernel"):
        tempered_gibbs(x, y, 0.5, 1.0, 1.0, kernel="hmc")
    with pytest.raises(ValueError, match="noise_scale"):
        tempered_gibbs(x, y, 0.5, 1.0)
    with pytest.raises(ValueError, match="prior_inclusion"):
        tempered_gibbs(x, y, 1.5, 1.0, 1.0)
    with pytest.raises(ValueError, match="polya_gamma"):
        tempered_gibbs(x, (y > 0).double(), 0.5, 1.0, family="bernoulli", polya_gamma="numpy")
    with pytest.raises(ValueError, match="num_chains >= 1, got 0"):
        tempered_gibbs(x, y, 0.5, 1.0, 1.0, num_chains=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_sampler_on_gpu(correlated_gaussian):
    x, y, exact = correlated_gaussian
    run = tempered_gibbs(
        torch.tensor(x, device="cuda"),
        torch.tensor(y, device="cuda"),
        0.2,
        0.5,
        1.0,
        run_length=RunLength(min_steps=3000, max_steps=3000),
        generator=torch.Generator(device="cuda").manual_seed(0),
    )
    within_mcse(run.inclusion, run.mcse, exact.inclusion)


def test_a_noise_that_collapses_on_a_model_fitting_y_exactly_is_a_clear_error():
    """4 observations, 3 features: the full model fits the centred y exactly, where the Jeffreys posterior of
    sigma is improper (sigma drifts to 0). The sampler says so instead of failing in a Cholesky factorisation
    or returning the probabilities of a collapsed noise."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 3, generator=g, dtype=torch.float64)
    x = (x - x.mean(0)) / x.std(0)
    y = x[:, 0] + 0.5 * torch.randn(4, generator=g, dtype=torch.float64)
    y = y - y.mean()
    start = torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"the model of features \[0, 1, 2\] fits the 4 observations of y exactly"):
        tempered_gibbs(
            x,
            y,
            0.3,
            1.0,
            0.5,
            start=start,
            num_chains=2,
            run_length=RunLength(warmup=0, max_steps=20_000),
            noise_prior="jeffreys",
            explore=1e-3,
            generator=torch.Generator().manual_seed(1),
        )
