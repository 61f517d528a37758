"""l0bayes.select_variables: correct probabilities on small problems, the k-hat diagnostic, clear errors.

References are independent of the code under test: SciPy's dense multivariate normal and brute
enumeration (tests/exact_spike_slab.py), l0bayes.selection.exact_inclusion_probabilities (its own
tests check it against quadrature), enumeration of all 2^p inclusion vectors, and known supports.
"""

import itertools
import math
import warnings

import numpy as np
import pytest
import torch
from exact_spike_slab import log_marginal_dense
from scipy.special import logsumexp
from sklearn.datasets import load_diabetes

import l0bayes
from l0bayes.selection import (
    exact_inclusion_probabilities,
    fit_single_effects,
    gate_importance_check,
    khat_meaning,
    ols_noise_scale,
)
from l0bayes.selection.importance import BernoulliMixture, collapsed_log_marginal

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")


def ar1_design(n, p, rho, rng):
    x = np.empty((n, p))
    x[:, 0] = rng.standard_normal(n)
    for j in range(1, p):
        x[:, j] = rho * x[:, j - 1] + math.sqrt(1 - rho**2) * rng.standard_normal(n)
    return x


def standardised(x, y):
    return (x - x.mean(0)) / x.std(0, ddof=1), y - y.mean()


@pytest.fixture(scope="module")
def diabetes():
    data = load_diabetes()
    x = (data.data - data.data.mean(0)) / data.data.std(0, ddof=1)
    y = (data.target - data.target.mean()) / data.target.std(ddof=1)
    sigma = ols_noise_scale(x, y)
    return x, y, sigma, exact_inclusion_probabilities(x, y, 0.5, 1.0, sigma).inclusion


# ------------------------------------------------------------------ building blocks
def test_collapsed_log_marginal_matches_dense_normal():
    rng = np.random.default_rng(0)
    x, y = standardised(ar1_design(40, 9, 0.6, rng), rng.standard_normal(40))
    subsets = [[0, 3], [1, 2, 5, 8], [4], [], [0, 1, 2, 3, 4, 5, 6, 7, 8]]
    width = max(len(s) for s in subsets)
    index = torch.tensor([s + [9] * (width - len(s)) for s in subsets])
    xt, yt = torch.tensor(x), torch.tensor(y)
    paths = [{"core": None}, {"core": torch.tensor([0, 1])}, {"core": torch.tensor([], dtype=torch.long)}]
    for kw in paths + [{"gram": xt.T @ xt}]:  # every Gram path: cached products, or read from a given X^T X
        log_ml, coef = collapsed_log_marginal(xt, yt, index, slab_scale=0.7, noise_scale=1.3, **kw)
        for k, s in enumerate(subsets):
            mask = np.zeros(9, bool)
            mask[s] = True
            assert log_ml[k].item() == pytest.approx(log_marginal_dense(x, y, mask, 0.7, 1.3), rel=1e-9)
            if s:  # conditional posterior mean: ridge solution with penalty sigma^2 / tau^2
                xs = x[:, s]
                ridge = np.linalg.solve(xs.T @ xs + (1.3 / 0.7) ** 2 * np.eye(len(s)), xs.T @ y)
                np.testing.assert_allclose(coef[k, : len(s)].numpy(), ridge, rtol=1e-9)
            assert (coef[k, len(s) :] == 0).all()


def test_bernoulli_mixture_log_prob_is_a_normalised_law():
    gen = torch.Generator().manual_seed(0)
    probs = torch.tensor([[0.9, 0.02, 0.03, 0.01, 0.4], [0.5, 0.02, 0.01, 0.03, 0.6]], dtype=torch.float64)
    weights = torch.tensor([0.3, 0.7], dtype=torch.float64)
    law = BernoulliMixture(probs, weights, core_mask=torch.tensor([True, False, False, False, True]))
    every = torch.tensor(list(itertools.product([0, 1], repeat=5)), dtype=torch.bool)
    lp = law.log_prob(every[:, law.core], every[:, law.background].sum(1))
    assert torch.logsumexp(lp, 0).item() == pytest.approx(0.0, abs=1e-12)
    # by hand: the background features share their component's mean probability
    bg = probs[:, 1:4].mean(1)
    eff = torch.cat([probs[:, :1], bg[:, None].expand(2, 3), probs[:, 4:]], 1)
    direct = torch.logsumexp(
        torch.stack([torch.where(every, eff[c].log(), (-eff[c]).log1p()).sum(1) for c in range(2)])
        + weights.log()[:, None],
        0,
    )
    torch.testing.assert_close(lp, direct)
    index, log_q = law.sample(4000, gen)
    draws = torch.zeros(4000, 6, dtype=torch.float64).scatter_(1, index, 1.0)[:, :5]
    torch.testing.assert_close(draws.mean(0), law.marginal, atol=0.03, rtol=0)
    on_core = draws[:, law.core].bool()
    torch.testing.assert_close(log_q, law.log_prob(on_core, draws[:, law.background].sum(1).long()))


def test_one_single_effect_is_the_exact_single_effect_posterior():
    rng = np.random.default_rng(1)
    x, y = standardised(ar1_design(60, 6, 0.8, rng), rng.standard_normal(60))
    y = y + 0.8 * x[:, 2]
    fit = fit_single_effects(torch.tensor(x), torch.tensor(y), num_effects=1, noise_variance=0.9, grow=False)
    tau = math.sqrt(fit.prior_variance[0].item())
    log_ml = np.array([log_marginal_dense(x, y, np.eye(6, dtype=bool)[j], tau, math.sqrt(0.9)) for j in range(6)])
    # rtol 1e-4: the fit takes its products with X in float32
    np.testing.assert_allclose(fit.alpha[0].numpy(), np.exp(log_ml - logsumexp(log_ml)), rtol=1e-4)
    assert fit.converged and fit.elbo[-1] >= fit.elbo[0] - 1e-9


# ------------------------------------------------------------------ select_variables
def test_small_p_matches_enumeration():
    rng = np.random.default_rng(2)
    x = ar1_design(200, 8, 0.85, rng)
    y = x[:, 1] * 0.5 - 0.4 * x[:, 5] + rng.standard_normal(200)
    xs, yc = standardised(x, y)
    exact = exact_inclusion_probabilities(xs, yc, 0.3, 0.6, 1.0).inclusion
    res = l0bayes.select_variables(x, y, prior_inclusion=0.3, slab_scale=0.6, noise_scale=1.0)
    assert res.reliable and res.method == "reweighted"
    np.testing.assert_allclose(res.inclusion_probabilities, exact, atol=0.1)


def test_diabetes_within_0_1_of_exact_and_reliable(diabetes):
    x, y, sigma, exact = diabetes
    res = l0bayes.select_variables(x, y, prior_inclusion=0.5, slab_scale=1.0, noise_scale=sigma)
    assert res.reliable and res.method == "reweighted"
    assert np.abs(res.inclusion_probabilities - exact).max() < 0.05
    assert (res.prior_inclusion, res.slab_scale, res.noise_scale) == (0.5, 1.0, sigma)
    assert "can be trusted" in res.diagnostic
    # here k-hat is negative (-4.26): the line says what that means, not only that it is <= 0.7
    assert res.khat < 0 and "negative: the weights' tail is bounded" in res.diagnostic


def test_khat_meaning_in_words():
    """Each range of k-hat is explained: negative (bounded tail, best), < 0.5, 0.5-0.7, > 0.7."""
    for khat in (-4.26, -0.05, -math.inf):
        assert khat_meaning(khat).startswith("negative: the weights' tail is bounded, lighter than exponential")
        assert "best case, reliable" in khat_meaning(khat)
    assert khat_meaning(0.0) == khat_meaning(0.49) and "finite variance; reliable" in khat_meaning(0.3)
    for khat in (0.5, 0.6, 0.7):
        assert "variance is infinite" in khat_meaning(khat) and "reliable" in khat_meaning(khat)
    for khat in (0.71, 1.5, math.inf):
        assert khat_meaning(khat).endswith("not reliable")
    with pytest.raises(ValueError, match="NaN"):
        khat_meaning(math.nan)


def test_diagnostic_flags_the_mean_field_fit_on_diabetes(diabetes, diabetes_mean_field):
    x, y, sigma, exact = diabetes
    fit = diabetes_mean_field  # trained on these data, this noise scale, this prior (tests/conftest.py)
    np.testing.assert_array_equal(fit.x, x)
    np.testing.assert_array_equal(fit.y, y)
    assert fit.sigma == sigma
    model = fit.model
    assert np.abs(model.inclusion_probabilities().numpy() - exact).max() > 0.3  # the failure being diagnosed
    check = gate_importance_check(model, x, y, seed=0)
    assert check.khat > 0.7 and not check.reliable
    assert check.meaning == khat_meaning(check.khat) and check.meaning.startswith("above 0.7")


def test_known_support_recovered_at_rho_0_9():
    rng = np.random.default_rng(3)
    n, p = 400, 200
    x = ar1_design(n, p, 0.9, rng)
    support = [20, 70, 120, 170]
    beta = np.zeros(p)
    beta[support] = [1.0, -0.8, 0.9, -1.0]
    y = x @ beta + rng.standard_normal(n)
    res = l0bayes.select_variables(torch.tensor(x), torch.tensor(y), feature_names=[f"x{j}" for j in range(p)])
    assert sorted(res.selected().tolist()) == support
    assert res.reliable and res.method == "reweighted"
    assert res.details["verified"]["max_gap"] < 0.2 and "the exact sampler, run from the fit, agrees" in res.diagnostic
    assert all(any(j in s for s in res.credible_sets) for j in support)
    np.testing.assert_allclose(res.coefficients[support], beta[support], atol=0.25)
    table = res.summary()
    assert list(table.index[:4]) != [] and set(table.index[:4]) == {f"x{j}" for j in support}


def test_result_object_inference_data_and_plot(diabetes):
    x, y, sigma, _ = diabetes
    res = l0bayes.select_variables(x, y, noise_scale=sigma, feature_names=list("abcdefghij"))
    idata = res.to_inference_data(num_draws=2000)
    gamma = idata.posterior["gamma"]
    assert gamma.dims == ("chain", "draw", "feature") and list(gamma.feature.values) == list("abcdefghij")
    # the resampled draws estimate the weighted mean of the drawn indicators ...
    weights = np.exp(res.log_weights - np.logaddexp.reduce(res.log_weights))
    np.testing.assert_allclose(gamma.mean(("chain", "draw")).values, weights @ res.draws, atol=0.06)
    # ... and the probabilities are Rao-Blackwellised: the exact ones at the fitted hyperparameters, more closely
    exact = exact_inclusion_probabilities(x, y, res.prior_inclusion, res.slab_scale, sigma).inclusion
    assert np.abs(res.inclusion_probabilities - exact).max() < 0.02
    assert np.abs(res.inclusion_probabilities - exact).max() < np.abs(weights @ res.draws - exact).max()
    assert idata.selection.attrs["khat"] == res.khat
    fig, ax = res.plot(exact=res.inclusion_probabilities)
    assert len(ax.patches) == 20 and ax.get_ylabel() == "inclusion probability"


def test_selection_plot_explains_its_colours(diabetes):
    """The legend names each credible set's colour and features, the grey, the open bars and the crosses."""
    x, y, sigma, exact = diabetes
    names = ["age", "sex", "bmi", "bp", "s1", "s2", "s3", "s4", "s5", "s6"]
    res = l0bayes.select_variables(x, y, prior_inclusion=0.5, slab_scale=1.0, noise_scale=sigma, feature_names=names)
    assert len(res.credible_sets) >= 2
    fig, ax = res.plot(exact=exact)
    legend = ax.get_legend()
    texts = [t.get_text() for t in legend.get_texts()]
    for k, members in enumerate(res.credible_sets):
        label = f"credible set {k + 1}: " + ", ".join(names[j] for j in members)
        assert label in texts
        colour = legend.legend_handles[texts.index(label)].get_facecolor()
        bar = ax.patches[list(np.argsort(-res.inclusion_probabilities)).index(members[0])]
        assert bar.get_facecolor() == colour  # the legend's colour is the bars' colour
    assert {
        "in no credible set",
        "variational fit (before the check)",
        "exact",
        "0.5: median-probability model",
    } <= set(texts)
    assert "reweighted" in legend.get_title().get_text()
    levels = [line.get_ydata()[0] for line in ax.get_lines() if list(line.get_xdata()) == [0, 1]]
    assert levels == [0.5]
    ticks = ax.get_xticklabels()  # legible: upright at this size, not 7-point text on its side
    assert [t.get_text() for t in ticks] == [names[j] for j in np.argsort(-res.inclusion_probabilities)]
    assert all(t.get_fontsize() >= 9 and t.get_rotation() == 0 for t in ticks)


@pytest.fixture(scope="module")
def hard_design():
    """AR(1) rho 0.9 with 20 effects among 200 features: the importance check fails here."""
    rng = np.random.default_rng(7)
    x = ar1_design(300, 200, 0.9, rng)
    beta = np.zeros(200)
    beta[rng.choice(200, 20, replace=False)] = rng.uniform(0.3, 1, 20)
    return x, x @ beta + rng.standard_normal(300), beta != 0


def test_failed_check_is_refined_by_the_sampler(hard_design):
    x, y, truth = hard_design
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        res = l0bayes.select_variables(x, y, time_budget=4.0)
    assert res.khat > 0.7 and res.method == "mcmc"
    assert res.mcse.shape == res.ess.shape == res.rhat.shape == (200,)
    assert res.details["sampler_steps"] > 0 and res.mixed in (True, False)
    assert res.reliable == res.mixed
    # sigma was not given: the sampler samples it (the fit's estimate is not trusted where its check failed)
    assert res.details["noise_prior"] == "jeffreys" and 0.7 < res.noise_scale < 1.4  # the true sigma is 1
    # never above 0.9 without a mixed chain: the features the sampler has not mixed on are capped
    unmixed = res.sampler.unmixed()
    assert not (res.inclusion_probabilities[unmixed] > 0.9).any()
    np.testing.assert_array_equal(res.capped, np.flatnonzero(unmixed & (res.sampler.inclusion > 0.9)))
    line = res.diagnostic
    assert "tempered Gibbs" in line and ("NOT mixed" in line) == (not res.mixed)
    assert res.inclusion_probabilities[truth].mean() > 0.7 and res.inclusion_probabilities[~truth].mean() < 0.05
    idata = res.to_inference_data(num_draws=400)
    gamma = idata.posterior["gamma"]
    assert gamma.shape == (4, 100, 200) and idata.selection.attrs["method"] == "mcmc"
    chains = gamma.mean("draw").values  # real chains: each its own estimate, close to the result
    assert np.abs(chains.mean(0) - res.sampler.inclusion).mean() < 0.03
    assert "rhat" in idata.selection and "mcse" in idata.selection


def test_variational_method_caps_unchecked_probabilities(hard_design):
    x, y, _ = hard_design
    with pytest.warns(RuntimeWarning, match="k-hat"):
        res = l0bayes.select_variables(x, y, method="variational")
    assert not res.reliable and res.method == "variational" and res.mcse is None
    high = np.flatnonzero(res.variational_probabilities > 0.9)
    assert high.size and np.array_equal(res.capped, high)
    assert res.inclusion_probabilities.max() <= 0.9
    np.testing.assert_array_equal(res.details["uncapped"], res.variational_probabilities)
    assert "capped at 0.9" in res.diagnostic


def test_sampler_that_has_not_mixed_says_so(hard_design):
    x, y, _ = hard_design
    with pytest.warns(RuntimeWarning, match="NOT mixed"):
        res = l0bayes.select_variables(x, y, method="mcmc", time_budget=0.05)
    assert res.method == "mcmc" and not res.mixed and not res.reliable
    assert not (res.inclusion_probabilities[res.sampler.unmixed()] > 0.9).any()
    # the line names only the criteria that failed, each with its worst value
    run = res.sampler
    relevant = np.flatnonzero(run.inclusion >= 0.01)[:2]
    run.rhat, run.ess = np.ones_like(run.rhat), np.full_like(run.ess, 1e4)
    run.rhat[relevant[0]] = 1.25
    assert "1 probability with R-hat above 1.01 (worst 1.250)" in res.diagnostic and "ESS" not in res.diagnostic
    # and it says what would mix them: R-hat^2 - 1 falls as 1/steps
    steps = math.ceil(run.num_steps * (1.25**2 - 1) / (1.01**2 - 1))
    assert (
        f"at least about {steps:,} steps per chain would mix them" in res.diagnostic
        and "method='mcmc'" in res.diagnostic
    )
    run.rhat[relevant[0]], run.ess[relevant] = 1.0, [40.0, 7.0]
    assert "2 probabilities with ESS below 100 (lowest 7)" in res.diagnostic and "R-hat above" not in res.diagnostic
    assert f"about {math.ceil(run.num_steps * 100 / 7):,} steps per chain" in res.diagnostic  # 1/ESS falls as 1/steps


def test_method_mcmc_matches_enumeration_on_diabetes(diabetes):
    x, y, sigma, exact = diabetes
    res = l0bayes.select_variables(x, y, prior_inclusion=0.5, slab_scale=1.0, noise_scale=sigma, method="mcmc")
    assert res.method == "mcmc" and res.mixed and res.reliable and res.capped.size == 0
    assert np.abs(res.inclusion_probabilities - exact).max() < 0.05
    assert np.all(np.abs(res.inclusion_probabilities - exact) <= 5 * res.mcse + 0.01)


def test_p_larger_than_n_is_handled():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((50, 300))
    y = 2.0 * x[:, 7] - 2.0 * x[:, 100] + rng.standard_normal(50)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        res = l0bayes.select_variables(x, y)
    assert res.inclusion_probabilities.shape == (300,)
    assert set(np.argsort(-res.inclusion_probabilities)[:2]) == {7, 100}


def test_bernoulli_family_recovers_strong_effects():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((400, 6))
    logits = 2.0 * x[:, 0] - 1.5 * x[:, 3]
    y = (rng.random(400) < 1 / (1 + np.exp(-logits))).astype(float)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        # (the fit's check fails and the sampler decides: 300 of its steps find effects this strong)
        res = l0bayes.select_variables(x, y, family="bernoulli", max_steps=600, time_budget=3.0, mcmc_steps=300)
    assert res.family == "bernoulli" and math.isfinite(res.khat)
    assert sorted(res.selected().tolist()) == [0, 3]
    assert res.coefficients[0] > 0 > res.coefficients[3]
    assert res.details["steps"] <= 600 and len(res.details["free_energy"]) == res.details["steps"]
    state = torch.get_rng_state()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        again = l0bayes.select_variables(x, y, family="bernoulli", max_steps=200, seed=3, method="variational")
        twice = l0bayes.select_variables(x, y, family="bernoulli", max_steps=200, seed=3, method="variational")
    np.testing.assert_array_equal(again.variational_probabilities, twice.variational_probabilities)  # seeded
    assert torch.equal(state, torch.get_rng_state())  # and the caller's generator untouched


def test_bernoulli_family_has_credible_sets():
    """A near-duplicate pair carries one signal: the logistic result has its credible set, as the Gaussian one does."""
    rng = np.random.default_rng(12)
    x = rng.standard_normal((200, 6))
    x[:, 1] = x[:, 0] + 0.05 * rng.standard_normal(200)  # correlation about 0.998
    y = (rng.random(200) < 1 / (1 + np.exp(-(1.5 * x[:, 0] - 1.2 * x[:, 4])))).astype(float)
    for prior_inclusion in (None, 0.3):  # the sets do not depend on whether the prior is estimated
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            res = l0bayes.select_variables(
                x, y, family="bernoulli", prior_inclusion=prior_inclusion, method="variational", max_steps=100
            )
        assert sorted(sorted(s.tolist()) for s in res.credible_sets) == [[0, 1], [4]]
        table = res.summary()
        assert table.loc[0, "credible_set"] == table.loc[1, "credible_set"] != table.loc[4, "credible_set"] >= 0
        assert (table.loc[[2, 3, 5], "credible_set"] == -1).all()


def test_bernoulli_sampler_through_select_variables_matches_quadrature():
    from exact_spike_slab import logistic_inclusion_quadrature

    rng = np.random.default_rng(8)
    x = ar1_design(120, 4, 0.8, rng)
    y = (rng.random(120) < 1 / (1 + np.exp(-(0.2 + 1.0 * x[:, 0] - 0.5 * x[:, 2])))).astype(float)
    xs = (x - x.mean(0)) / x.std(0, ddof=1)
    exact = logistic_inclusion_quadrature(xs, y, 0.3, 1.0, 10.0, points=8)
    res = l0bayes.select_variables(
        x, y, family="bernoulli", prior_inclusion=0.3, slab_scale=1.0, method="mcmc", max_steps=300, mcmc_steps=1500
    )
    assert res.method == "mcmc" and res.family == "bernoulli"
    assert np.all(np.abs(res.inclusion_probabilities - exact) <= 5 * res.mcse + 0.01)


@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        (lambda x, y: (np.where(np.eye(30, 5, dtype=bool), np.nan, x), y), ValueError, "X contains NaN"),
        (lambda x, y: (x, np.r_[y[:-1], np.inf]), ValueError, "y contains NaN"),
        (lambda x, y: (np.c_[x, np.ones(30)], y), ValueError, r"constant columns \[5\]"),
        (lambda x, y: (x, y[:-1]), ValueError, r"y must have shape \(30,\)"),
        (lambda x, y: (x[:, 0], y), ValueError, r"X must have shape \(n, p\)"),
        (lambda x, y: (x, np.zeros(30)), ValueError, "y is constant"),
        (lambda x, y: (x.astype(str).astype(object) + "a", y), TypeError, "numeric"),
    ],
)
def test_bad_inputs_give_clear_errors(change, error, match):
    rng = np.random.default_rng(6)
    x, y = change(rng.standard_normal((30, 5)), rng.standard_normal(30))
    with pytest.raises(error, match=match):
        l0bayes.select_variables(x, y)


def test_bad_arguments_give_clear_errors():
    rng = np.random.default_rng(6)
    x, y = rng.standard_normal((30, 5)), rng.standard_normal(30)
    with pytest.raises(ValueError, match="family"):
        l0bayes.select_variables(x, y, family="poisson")
    with pytest.raises(ValueError, match="prior_inclusion"):
        l0bayes.select_variables(x, y, prior_inclusion=1.0)
    with pytest.raises(ValueError, match="slab_scale"):
        l0bayes.select_variables(x, y, slab_scale=0.0)
    with pytest.raises(ValueError, match=r"y in \{0, 1\}"):
        l0bayes.select_variables(x, y, family="bernoulli")
    with pytest.raises(ValueError, match="feature names"):
        l0bayes.select_variables(x, y, feature_names=["a"])
    with pytest.raises(TypeError, match="unknown options"):
        l0bayes.select_variables(x, y, steps=10)
    with pytest.raises(ValueError, match="method must be one of"):
        l0bayes.select_variables(x, y, method="exact")
    with pytest.raises(ValueError, match="time_budget"):
        l0bayes.select_variables(x, y, time_budget=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_select_variables_on_gpu(diabetes):
    x, y, sigma, exact = diabetes
    res = l0bayes.select_variables(x, y, prior_inclusion=0.5, slab_scale=1.0, noise_scale=sigma, device="cuda")
    assert np.abs(res.inclusion_probabilities - exact).max() < 0.1


def test_benchmark_script_small_setting(tmp_path):
    import sys
    from pathlib import Path

    bench = Path(__file__).resolve().parents[1] / "benchmarks"
    sys.path.insert(0, str(bench))
    try:
        import bench_variable_selection as bvs
    finally:
        sys.path.remove(str(bench))
    out = tmp_path / "r.json"
    args = ["--n", "200", "--p", "60", "--rho", "0.5", "--seeds", "1", "--effects", "3"]
    records = bvs.main([*args, "--methods", "l0bayes", "l0bayes-fit", "lassocv", "--json", str(out)])
    assert {r["method"] for r in records} == {"l0bayes", "l0bayes-fit", "lassocv"} and out.exists()
    alone = next(r for r in records if r["method"] == "l0bayes-fit")
    assert alone["used"] in ("reweighted", "variational")  # never the sampler
    assert all(0 <= r["auprc"] <= 1 for r in records)
    with pytest.raises(SystemExit, match="exists"):
        bvs.main([*args, "--json", str(out)])


def test_overhead_script_times_the_default_beside_the_fit_and_another_tree(tmp_path):
    """The baseline tree is this one, imported under another name: both run in one process."""
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(root / "benchmarks"))
    try:
        import bench_selection_overhead as bso
    finally:
        sys.path.remove(str(root / "benchmarks"))
    out = tmp_path / "o.jsonl"
    args = ["--n", "150", "--p", "40", "--effects", "3", "--seeds", "1", "--repeats", "1", "--rho", "0.5"]
    name, threads = f"l0bayes_baseline_{tmp_path.name}", torch.get_num_threads()
    try:
        records = bso.main([*args, "--baseline", str(root), "--baseline-name", name, "--json", str(out)])
        assert out.exists() and len(records) == 1
        assert set(records[0]["seconds"]) == {"auto", "fit", "baseline"} and min(records[0]["seconds"].values()) > 0
        # the baseline's own code ran: its modules are the copy's, not this tree's
        selection = sys.modules[f"{name}.selection.api"]
        assert Path(selection.__file__).parent.parent.name == name and selection.torch is torch
        assert "auto / baseline" in bso.table(records, markdown=True)
        with pytest.raises(SystemExit, match="already imported"):
            bso.import_baseline(root, name)
    finally:
        for module in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
            del sys.modules[module]
        torch.set_num_threads(threads)
    with pytest.raises(SystemExit, match="exists"):
        bso.main([*args, "--json", str(out)])
    with pytest.raises(SystemExit, match="no l0bayes package"):
        bso.import_baseline(tmp_path)


def test_the_test_of_a_passed_check_weighs_a_gap_against_its_monte_carlo_error(monkeypatch):
    """A move beyond AGREE within twice its MCSE confirms the fit; beyond that the full run answers. The MCSE
    is computed only where some move exceeds AGREE."""
    from l0bayes.selection import mcmc as selection

    class Short:  # the short run: its MCSE only on demand
        def __init__(self, mcse):
            self.num_steps, self.seconds, self.asked, self._mcse = 150, 0.5, 0, mcse

        def diagnose(self):
            self.asked += 1
            self.mcse = self._mcse
            return self

    def fake_refine(fit, xs, y, family, opts, budget, noise_given, warmup=500, diagnose=True):
        if diagnose:  # the full run
            return {**fit, "method": "mcmc", "details": {}, "inclusion": np.array([0.5, 0.9, 0.1])}
        run = runs.pop(0)
        return {"inclusion": np.array([0.5, 0.9, moved]), "mcse": None, "sampler": run}

    monkeypatch.setattr(selection, "refine", fake_refine)
    fit = {"inclusion": np.array([0.5, 0.9, 0.1]), "method": "reweighted", "details": {}}
    for moved, mcse, confirmed, asked in [(0.35, 0.05, True, 1), (0.35, 0.01, False, 1), (0.25, 0.0, True, 0)]:
        runs = [Short(np.array([0.0, 0.0, mcse]))]
        run = runs[0]
        out = selection.verify({**fit, "details": {}}, None, None, "gaussian", {"mcmc_steps": 1250}, 15.0, True)
        assert ("verified" in out["details"]) is confirmed and out["method"] == ("reweighted" if confirmed else "mcmc")
        assert run.asked == asked  # (0.25 - 0.1 = 0.15 <= AGREE: no MCSE needed)
        if not confirmed:
            assert out["details"]["check_contradicted"]["feature"] == 2


def test_a_passed_check_that_the_sampler_contradicts_gives_the_samplers_answer():
    """Pareto k-hat cannot see a mode the fit never proposes: the sampler, run from the fit, decides."""
    from l0bayes.selection import arguments, mcmc

    rng = np.random.default_rng(5)
    n, p = 300, 40
    x = ar1_design(n, p, 0.5, rng)
    beta = np.zeros(p)
    beta[[3, 17, 30]] = [1.0, -1.0, 0.8]
    y = x @ beta + rng.standard_normal(n)
    res = l0bayes.select_variables(x, y, prior_inclusion=0.1, slab_scale=1.0, noise_scale=1.0)
    assert res.method == "reweighted" and res.inclusion_probabilities[[3, 17, 30]].min() > 0.99
    # the same fit with feature 17 forgotten: its check would have passed on what it proposed
    xs, yc, _, k, _ = arguments.standardise(torch.tensor(x), torch.tensor(y), "gaussian")
    scale = math.ldexp(1.0, -k)  # y is divided by 2**k inside, and so are the slab and the noise scale
    opts = {"num_chains": 4, "mcmc_steps": 1250, "generator": torch.Generator().manual_seed(0)}
    wrong = np.array(res.inclusion_probabilities)
    wrong[17] = 0.0
    start = torch.as_tensor(np.clip(wrong, 1e-3, 1 - 1e-3))
    fit = {"inclusion": wrong, "start": start, "hyper": (0.1, scale, scale), "details": {}, "khat": 0.3}
    out = mcmc.verify(fit, xs, yc, "gaussian", opts, 15.0, noise_given=True)
    assert out["method"] == "mcmc" and out["details"]["check_contradicted"]["feature"] == 17
    assert out["inclusion"][17] > 0.9
