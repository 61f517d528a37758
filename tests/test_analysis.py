"""l0bayes.analysis: ArviZ data, summaries, plots, and the exact spike-and-slab enumeration.

References are independent of the code under test: gate probabilities from the closed forms of
Eq. 12-13 written in numpy, Monte Carlo fractions of the draws, ``l0bayes.nn.architecture`` for the
pruned architecture, and ``exact_spike_slab`` (SciPy multivariate normal, quadrature, importance
sampling) for the enumeration.
"""

import io
import math
import warnings

import matplotlib
import numpy as np
import pytest
import torch

matplotlib.use("Agg")

pytest.importorskip("arviz")

import exact_spike_slab as ref  # noqa: E402

from l0bayes.analysis import (  # noqa: E402
    gate_layers,
    inclusion_summary,
    layer_summary,
    median_probability_model,
    plot_expected_flops,
    plot_expected_gate,
    plot_gate_heatmap,
    plot_hard_concrete,
    plot_inclusion_forest,
    pruned_architecture,
    to_inference_data,
)
from l0bayes.models import SparseClassifier, SparseLinearRegression, SparseLogisticRegression  # noqa: E402
from l0bayes.nn import L0MLP, L0LeNet5, architecture  # noqa: E402
from l0bayes.selection import exact_inclusion_probabilities, log_marginal_likelihood, ols_noise_scale  # noqa: E402

NAMES = ["age", "sex", "bmi", "bp", "s1"]
BETA, GAMMA, ZETA = 2.0 / 3.0, -0.1, 1.1


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _prob_nonzero(log_alpha):  # Eq. 12, written out
    return _sigmoid(log_alpha - BETA * np.log(-GAMMA / ZETA))


def _prob_one(log_alpha):  # P(s_bar >= 1) = P(logistic noise >= beta * log((1 - gamma) / (zeta - 1)) - log_alpha)
    return _sigmoid(log_alpha - BETA * np.log((1 - GAMMA) / (ZETA - 1)))


def _test_gate(log_alpha):  # Eq. 13
    return np.clip(_sigmoid(log_alpha) * (ZETA - GAMMA) + GAMMA, 0, 1)


def _png(fig):
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    data = buf.getvalue()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000
    return data


@pytest.fixture
def regression():
    model = SparseLinearRegression(5, slab="gaussian")
    with torch.no_grad():
        model.gate.log_alpha.copy_(torch.tensor([-6.0, -1.0, 0.3, 2.0, 8.0]))
        model.weight.copy_(torch.tensor([0.5, -1.0, 2.0, 0.1, -0.3]))
    return model


@pytest.fixture
def classifier():
    torch.manual_seed(0)
    net = L0MLP(64, (12,), 10, init_drop_rates=0.3)
    with torch.no_grad():
        net.fc1.gate.log_alpha[::3] = -8.0  # close a third of the pixels
        net.fc2.gate.log_alpha[:5] = -8.0
    return SparseClassifier(net, lam=0.1)


# ---------------------------------------------------------------------------- InferenceData


def test_import_is_lazy():
    import subprocess
    import sys

    code = (
        "import sys, l0bayes.analysis; "
        "print(sorted(m for m in ('arviz', 'matplotlib', 'pandas', 'xarray') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_regression_inference_data_layout_and_values(regression):
    idata = to_inference_data(regression, num_draws=6000, feature_names=NAMES, weights=True)
    z = idata.posterior["z"]
    # independent draws, not a Markov chain: one chain, so no chain diagnostics are implied
    assert z.dims == ("chain", "draw", "feature") and z.shape == (1, 6000, 5)
    assert list(z["feature"].values) == NAMES
    la = regression.gate.log_alpha.detach().double().numpy()
    gates = idata.gates
    np.testing.assert_allclose(gates["z_log_alpha"], la)
    np.testing.assert_allclose(gates["z_prob_nonzero"], _prob_nonzero(la), rtol=1e-10)
    np.testing.assert_allclose(gates["z_prob_zero"], 1 - _prob_nonzero(la), rtol=1e-9, atol=1e-14)
    np.testing.assert_allclose(gates["z_prob_one"], _prob_one(la), rtol=1e-9)
    np.testing.assert_allclose(gates["z_test_gate"], _test_gate(la), atol=1e-12)
    np.testing.assert_allclose(gates["z_prob_nonzero"], regression.gate.prob_nonzero().detach().double(), rtol=1e-6)
    # the draws follow q: fractions at 0 and 1 and the mean match the exact values within 5 standard errors
    flat = z.values.reshape(-1, 5)
    n = flat.shape[0]
    for frac, p in (((flat != 0).mean(0), gates["z_prob_nonzero"].values), ((flat == 1).mean(0), _prob_one(la))):
        assert np.all(np.abs(frac - p) <= 5 * np.sqrt(p * (1 - p) / n) + 1e-12)
    assert np.all(np.abs(flat.mean(0) - gates["z_mean"].values) <= 5 * flat.std(0) / np.sqrt(n) + 1e-12)
    assert flat.min() >= 0 and flat.max() <= 1
    # theta = (slab draw) * z: exactly zero where the gate is, and centred on weight * E[z]
    theta = idata.posterior["theta"].values.reshape(-1, 5)
    assert np.all(theta[flat == 0] == 0)
    w = regression.weight.detach().double().numpy()
    s = regression.slab_log_scale.detach().double().exp().numpy()
    expected = w * gates["z_mean"].values
    sd = np.sqrt(((w**2 + s**2) * (flat**2).mean(0)) / n)
    assert np.all(np.abs(theta.mean(0) - expected) <= 6 * sd)


def test_inference_data_is_seeded_and_leaves_global_rng_alone(regression):
    torch.manual_seed(123)
    before = torch.rand(3)
    torch.manual_seed(123)
    a = to_inference_data(regression, num_draws=50, seed=7)
    after = torch.rand(3)
    b = to_inference_data(regression, num_draws=50, seed=7)
    c = to_inference_data(regression, num_draws=50, seed=8)
    assert torch.equal(before, after)
    np.testing.assert_array_equal(a.posterior["z"].values, b.posterior["z"].values)
    assert not np.array_equal(a.posterior["z"].values, c.posterior["z"].values)


def test_inference_data_survives_netcdf(regression, tmp_path):
    import arviz as az

    idata = to_inference_data(regression, num_draws=20, feature_names=NAMES)
    path = tmp_path / "gates.nc"
    idata.to_netcdf(str(path))
    back = az.from_netcdf(str(path))
    assert set(back.groups()) == {"posterior", "gates"}
    np.testing.assert_array_equal(back.posterior["z"].values, idata.posterior["z"].values)
    assert median_probability_model(back) == median_probability_model(idata)


def test_inference_data_bad_input(regression):
    with pytest.raises(ValueError, match="5 gates but 3"):
        to_inference_data(regression, num_draws=5, feature_names=["a", "b", "c"])
    with pytest.raises(ValueError, match="unknown layers"):
        to_inference_data(regression, num_draws=5, coords={"fc9": range(5)})
    with pytest.raises(ValueError, match="num_draws"):
        to_inference_data(regression, num_draws=0)
    for bad in (2.5, float("nan"), float("inf"), -3):  # 2.5 used to become 2 without a word
        with pytest.raises(ValueError, match="num_draws must be a whole number"):
            to_inference_data(regression, num_draws=bad)
    with pytest.raises(TypeError, match="num_draws"):
        to_inference_data(regression, num_draws="10")
    with pytest.raises(ValueError, match="seed"):
        to_inference_data(regression, num_draws=5, seed=1.5)
    assert to_inference_data(regression, num_draws=3.0).posterior["z"].shape == (1, 3, 5)
    with pytest.raises(ValueError, match="no HardConcreteGate"):
        to_inference_data(torch.nn.Linear(2, 2))
    with pytest.raises(TypeError):
        to_inference_data("not a model")


def test_logistic_regression_and_point_slab():
    model = SparseLogisticRegression(3)
    idata = to_inference_data(model, num_draws=20, weights=True)
    assert idata.posterior["z"].shape == (1, 20, 3)
    np.testing.assert_allclose(
        idata.posterior["theta"].values, model.weight.detach().double().numpy() * idata.posterior["z"].values
    )


def test_network_inference_data(classifier):
    net = classifier.net
    idata = to_inference_data(classifier, num_draws=80, weights=True)
    post = idata.posterior
    assert [gl.name for gl in gate_layers(classifier)] == ["fc1", "fc2"]
    assert post["z_fc1"].dims == ("chain", "draw", "fc1_gate") and post["z_fc1"].shape == (1, 80, 64)
    assert post["z_fc2"].shape == (1, 80, 12)
    assert list(post["fc1_gate"].values) == list(range(64))
    assert post["w_fc1"].dims == ("chain", "draw", "fc1_out", "fc1_gate") and post["w_fc1"].shape == (1, 80, 12, 64)
    z, w = post["z_fc1"].values, post["w_fc1"].values
    np.testing.assert_allclose(w, net.fc1.weight.detach().double().numpy()[None, None] * z[:, :, None, :])
    la2 = net.fc2.gate.log_alpha.detach().double().numpy()
    np.testing.assert_allclose(idata.gates["z_fc2_prob_nonzero"], _prob_nonzero(la2), rtol=1e-10)
    assert idata.gates.attrs["z_fc1_group_size"] == 12
    # a bare network works the same way
    assert set(to_inference_data(net, num_draws=2).posterior.data_vars) == {"z_fc1", "z_fc2"}


def test_conv_network_weights():
    net = L0LeNet5(input_size=8, conv_channels=(3, 4), fc_hidden=6, kernel_size=3, padding=1)
    idata = to_inference_data(net, num_draws=4, weights=True, coords={"conv1": ["a", "b", "c"]})
    post = idata.posterior
    assert post["z_conv1"].dims == ("chain", "draw", "conv1_gate")
    assert list(post["conv1_gate"].values) == ["a", "b", "c"]
    assert post["w_conv1"].dims == ("chain", "draw", "conv1_gate", "conv1_in", "conv1_kh", "conv1_kw")
    assert post["w_conv1"].shape == (1, 4, 3, 1, 3, 3)
    z = post["z_conv2"].values
    np.testing.assert_allclose(
        post["w_conv2"].values, net.conv2.weight.detach().double().numpy()[None, None] * z[:, :, :, None, None, None]
    )


# ---------------------------------------------------------------------------- summaries


def test_inclusion_summary(regression):
    idata = to_inference_data(regression, num_draws=1000, feature_names=NAMES)
    table = inclusion_summary(idata, hdi_prob=0.9)
    assert list(table["gate"]) == NAMES and len(table) == 5
    la = regression.gate.log_alpha.detach().double().numpy()
    np.testing.assert_allclose(table["prob_nonzero"], _prob_nonzero(la), rtol=1e-10)
    np.testing.assert_allclose(table["prob_zero"] + table["prob_nonzero"], 1.0, rtol=1e-12)
    flat = idata.posterior["z"].values.reshape(-1, 5)
    np.testing.assert_allclose(table["mc_prob_nonzero"], (flat != 0).mean(0))
    np.testing.assert_allclose(table["mean"], flat.mean(0))
    assert np.all(np.abs(table["mc_prob_nonzero"] - table["prob_nonzero"]) <= 5 * table["mcse_prob_nonzero"] + 1e-3)
    lo, hi = table["hdi_5%"], table["hdi_95%"]
    assert np.all((0 <= lo) & (lo <= hi) & (hi <= 1))
    # the 90% HDI of a gate that is 0 with probability > 0.9 is the atom {0}; of one that is 1, {1}
    assert hi.iloc[0] == 0 and lo.iloc[-1] == 1
    assert list(table["included"]) == list(_prob_nonzero(la) > 0.5)
    # independent draws: no chain diagnostics, and ArviZ raises no one-chain warning either
    assert not {"r_hat", "ess_bulk", "ess_tail", "mcse_mean"} & set(table.columns)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        inclusion_summary(idata)


def test_layer_summary_and_median_model(classifier):
    idata = to_inference_data(classifier, num_draws=500)
    table = layer_summary(idata, hdi_prob=0.9)
    assert list(table.index) == ["fc1", "fc2"]
    for name, layer in (("fc1", classifier.net.fc1), ("fc2", classifier.net.fc2)):
        q = _prob_nonzero(layer.gate.log_alpha.detach().double().numpy())
        row = table.loc[name]
        assert row["num_gates"] == q.size and row["group_size"] == layer.group_size
        assert math.isclose(row["expected_active"], q.sum(), rel_tol=1e-6)
        assert math.isclose(row["expected_l0"], float(layer.expected_l0().detach()), rel_tol=1e-5)
        assert row["active_hdi_5%"] <= q.sum() <= row["active_hdi_95%"]
        assert row["median_model"] == (q > 0.5).sum()
    median = median_probability_model(idata)
    q1 = _prob_nonzero(classifier.net.fc1.gate.log_alpha.detach().double().numpy())
    assert median["fc1"] == [int(i) for i in np.flatnonzero(q1 > 0.5)]
    assert 0 not in median["fc1"] and 1 in median["fc1"]
    assert pruned_architecture(idata) == architecture(classifier.net)
    assert pruned_architecture(idata, var_names="z_fc2") == architecture(classifier.net).split("-")[1]
    with pytest.raises(ValueError, match="unknown gate variables"):
        layer_summary(idata, var_names=["z_fc7"])


def test_median_model_regression_labels(regression):
    idata = to_inference_data(regression, num_draws=2, feature_names=NAMES)
    la = regression.gate.log_alpha.detach().double().numpy()
    assert median_probability_model(idata) == {"z": [n for n, on in zip(NAMES, _prob_nonzero(la) > 0.5) if on]}


# ---------------------------------------------------------------------------- plots


def test_plot_hard_concrete_atoms_and_density():
    fig, ax = plot_hard_concrete(log_alpha=0.0, temperature=0.5, num_samples=2000)
    _png(fig)
    # the stems carry P(z = 0) and P(z = 1); for log_alpha = 0, beta = 0.5 both are sigmoid(0.5 log(1.1/0.1))
    expected = _sigmoid(-0.5 * np.log(0.1 / 1.1))
    expected = 1 - expected
    markers = [line for line in ax.lines if line.get_marker() == "o"]
    heights = sorted(float(line.get_ydata()[0]) for line in markers)
    np.testing.assert_allclose(heights, [expected, expected], rtol=1e-9)
    # the density line integrates (with the atoms) to one
    hc_line = next(line for line in ax.lines if "hard concrete" in str(line.get_label()))
    zs, dens = hc_line.get_xdata(), hc_line.get_ydata()
    area = np.trapezoid(dens, zs) if hasattr(np, "trapezoid") else np.trapz(dens, zs)
    assert abs(area + 2 * expected - 1) < 5e-3


def test_plot_expected_gate_matches_monte_carlo():
    fig, ax = plot_expected_gate(log_alpha=np.linspace(-4, 4, 9), num_samples=4000)
    _png(fig)
    exact = next(line for line in ax.lines if "exact" in str(line.get_label())).get_ydata()
    sampled = next(line for line in ax.lines if "samples" in str(line.get_label())).get_ydata()
    assert np.max(np.abs(np.asarray(exact) - np.asarray(sampled))) < 0.03
    eq13 = next(line for line in ax.lines if "Eq. 13" in str(line.get_label())).get_ydata()
    np.testing.assert_allclose(eq13, _test_gate(np.linspace(-4, 4, 9)), atol=1e-12)


@pytest.mark.parametrize("num_samples", [0, -1, 2.5])
def test_plot_expected_gate_refuses_a_sample_count_below_one(num_samples):
    # 0 drew NaN curves (a mean over no samples); -1 failed inside torch's expand.
    with pytest.raises(ValueError, match="plot_expected_gate: num_samples must be a whole number >= 1"):
        plot_expected_gate(num_samples=num_samples)
    if num_samples != 0:  # plot_hard_concrete draws no samples for 0
        with pytest.raises(ValueError, match="plot_hard_concrete: num_samples must be a whole number >= 0"):
            plot_hard_concrete(num_samples=num_samples)
    with pytest.raises(ValueError, match=r"plot_expected_gate: seed must be a whole number in \[0, 2\*\*64\)"):
        plot_expected_gate(num_samples=10, seed=2**70)
    fig, ax = plot_expected_gate(log_alpha=[0.0], num_samples=1)  # one draw is a mean too
    assert all(np.isfinite(np.asarray(line.get_ydata(), dtype=float)).all() for line in ax.lines)


def test_plot_forest_and_heatmaps(regression, classifier):
    idata = to_inference_data(regression, num_draws=200, feature_names=NAMES)
    fig, ax = plot_inclusion_forest(idata)
    _png(fig)
    assert [t.get_text() for t in ax.get_yticklabels()] == NAMES
    dots = next(line for line in ax.lines if line.get_label() == "q(z != 0)")
    np.testing.assert_allclose(dots.get_xdata(), idata.gates["z_prob_nonzero"].values)
    cidata = to_inference_data(classifier, num_draws=50)
    with pytest.raises(ValueError, match="max_gates"):
        plot_inclusion_forest(cidata, max_gates=50)
    fig, ax = plot_gate_heatmap(cidata, "fc1", quantity="active")  # 64 input pixels -> 8x8
    _png(fig)
    image = ax.images[0].get_array()
    assert image.shape == (8, 8)
    np.testing.assert_array_equal(np.asarray(image).ravel() > 0, classifier.net.fc1.active_mask().numpy())
    fig, ax = plot_gate_heatmap(classifier, quantity="prob_nonzero")  # straight from the model
    np.testing.assert_allclose(
        np.asarray(ax.images[0].get_array()).ravel(),
        _prob_nonzero(classifier.net.fc1.gate.log_alpha.detach().double().numpy()),
        rtol=1e-9,
    )
    fig, ax = plot_gate_heatmap(cidata, "z_fc2", image_shape=(3, 4))
    assert ax.images[0].get_array().shape == (3, 4)
    with pytest.raises(ValueError, match="not a square"):
        plot_gate_heatmap(cidata, "fc2")
    with pytest.raises(ValueError, match="unknown layer"):
        plot_gate_heatmap(classifier, "fc9")


def test_plot_expected_flops_from_training_history(one_thread):
    from l0bayes.inference import ExpectedFlops, train

    torch.manual_seed(0)
    x, y = torch.randn(64, 1, 4, 4), torch.randint(0, 3, (64,))
    model = SparseClassifier(L0MLP(16, (8,), 3, init_drop_rates=0.5), lam=0.1)
    result = train(
        model, x, y, objective="penalized", epochs=2, batch_size=32, lr=0.05, progress=False,
        callbacks=[ExpectedFlops((1, 4, 4))],
    )  # fmt: skip
    fig, ax = plot_expected_flops({"L0": result.history}, dense_flops=1000.0)
    _png(fig)
    line = ax.lines[0]
    np.testing.assert_allclose(line.get_ydata(), [r["expected_flops"] for r in result.history])
    assert list(line.get_xdata()) == [1, 2]
    with pytest.raises(ValueError, match="has epochs without 'expected_flops'"):
        plot_expected_flops([{"epoch": 1}])


# ---------------------------------------------------------------------------- exact enumeration


def _tiny_problem(seed=0, n=8, p=3):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, p))
    x[:, 2] = 0.8 * x[:, 1] + 0.6 * x[:, 2]  # a correlated pair
    y = 1.2 * x[:, 0] + 0.3 * x[:, 1] + rng.normal(scale=0.8, size=n)
    return x - x.mean(0), y - y.mean()


def test_log_marginal_against_dense_and_quadrature():
    x, y = _tiny_problem()
    for subset in ([0, 0, 0], [1, 0, 0], [0, 1, 1], [1, 1, 1], [1, 0, 1]):
        ours = log_marginal_likelihood(x, y, np.array(subset, bool), 1.5, 0.8)
        assert math.isclose(ours, ref.log_marginal_dense(x, y, subset, 1.5, 0.8), rel_tol=1e-10, abs_tol=1e-10)
        if 1 <= sum(subset) <= 2:
            assert math.isclose(ours, ref.log_marginal_quadrature(x, y, subset, 1.5, 0.8), abs_tol=1e-6)


def test_exact_inclusion_against_brute_force():
    x, y = _tiny_problem(seed=1, n=10)
    exact = exact_inclusion_probabilities(x, y, prior_inclusion=0.3, slab_scale=1.0, noise_scale=0.8)
    np.testing.assert_allclose(exact.inclusion, ref.inclusion_dense(x, y, 0.3, 1.0, 0.8), rtol=1e-9)
    est, se = ref.inclusion_importance_sampling(x, y, 0.3, 1.0, 0.8, 200_000, np.random.default_rng(0))
    assert np.all(np.abs(exact.inclusion - est) <= 5 * se + 1e-3)
    assert math.isclose(exact.model_probs.sum(), 1.0, rel_tol=1e-12)
    assert exact.models.shape == (8, 3)
    top = exact.top_models(2, names=["a", "b", "c"])
    assert top[0][0] >= top[1][0] and "a" in top[0][1]


def test_exact_bad_input_and_noise_default():
    x, y = _tiny_problem()
    with pytest.raises(ValueError, match="prior_inclusion"):
        exact_inclusion_probabilities(x, y, prior_inclusion=1.0)
    with pytest.raises(ValueError, match="slab_scale"):
        exact_inclusion_probabilities(x, y, slab_scale=0.0)
    with pytest.raises(ValueError, match="at most"):
        exact_inclusion_probabilities(np.zeros((30, 21)), np.zeros(30))
    with pytest.raises(ValueError, match="shape"):
        exact_inclusion_probabilities(x, y[:-1])
    beta = np.linalg.lstsq(x, y, rcond=None)[0]
    rss = np.sum((y - x @ beta) ** 2)
    assert math.isclose(ols_noise_scale(x, y), math.sqrt(rss / (x.shape[0] - x.shape[1])), rel_tol=1e-12)


def _log_marginal_mpmath(x, y, subset, tau, sigma):
    """``log N(y; 0, sigma^2 I + tau^2 X_S X_S^T)`` in 60-digit arithmetic: n-dimensional, no Woodbury, no QR."""
    import mpmath

    with mpmath.workdps(60):
        xs = x[:, np.asarray(subset, dtype=bool)]
        n = len(y)
        cov = mpmath.matrix(n, n)
        for i in range(n):
            for j in range(n):
                dot = mpmath.fsum(mpmath.mpf(float(a)) * mpmath.mpf(float(b)) for a, b in zip(xs[i], xs[j]))
                cov[i, j] = mpmath.mpf(tau) ** 2 * dot + (mpmath.mpf(sigma) ** 2 if i == j else 0)
        yv = mpmath.matrix([mpmath.mpf(float(v)) for v in y])
        quad = (yv.T * mpmath.lu_solve(cov, yv))[0]
        return float(-0.5 * n * mpmath.log(2 * mpmath.pi) - 0.5 * mpmath.log(mpmath.det(cov)) - 0.5 * quad)


@pytest.mark.parametrize("noise_scale", [0.7, None])
def test_exact_inclusion_without_features_is_the_empty_model(noise_scale):
    # p = 0 failed in a reshape; the one model is the empty one, y ~ N(0, sigma^2 I).
    y = np.random.default_rng(1).normal(size=12)
    exact = exact_inclusion_probabilities(np.zeros((12, 0)), y, noise_scale=noise_scale)
    assert exact.inclusion.shape == (0,) and exact.coef_mean.shape == (0,) and exact.models.shape == (1, 0)
    np.testing.assert_array_equal(exact.model_probs, [1.0])
    sigma = noise_scale if noise_scale is not None else math.sqrt(float(y @ y) / 12)
    normal = -0.5 * 12 * math.log(2 * math.pi * sigma**2) - 0.5 * float(y @ y) / sigma**2
    assert exact.log_marginal[0] == pytest.approx(normal, rel=1e-12)
    assert exact.top_models() == [(1.0, [])]


def test_exact_inclusion_with_tiny_residual_noise_against_high_precision():
    """A null feature used to get 0.5 when the residual noise is tiny: the quadratic form cancelled."""
    rng = np.random.default_rng(0)
    n = 16
    x = rng.normal(size=(n, 3))
    x -= x.mean(0)
    y = 2.0 * x[:, 0] + 1e-12 * rng.normal(size=n)
    y -= y.mean()
    sigma = ols_noise_scale(x, y)
    assert sigma < 1e-10
    exact = exact_inclusion_probabilities(x, y)  # noise_scale estimated: the case that cancelled
    ref_log_ml = np.array([_log_marginal_mpmath(x, y, m, 1.0, sigma) for m in exact.models])
    # Models without feature 0 sit near -1e25, the others near +100: float64 inputs with a residual
    # 1e-12 of |y| leave about 1e-3 nats of conditioning error in the latter (the old code was off by ~1e9).
    np.testing.assert_allclose(exact.log_marginal, ref_log_ml, rtol=1e-9, atol=0.05)
    log_post = ref_log_ml - ref_log_ml.max()
    ref_inclusion = (np.exp(log_post)[:, None] * exact.models).sum(0) / np.exp(log_post).sum()
    np.testing.assert_allclose(exact.inclusion, ref_inclusion, rtol=0.1)
    assert exact.inclusion[0] == pytest.approx(1.0) and np.all(exact.inclusion[1:] < 1e-6)
    # the same problem with moderate noise still agrees with the dense reference
    exact = exact_inclusion_probabilities(x, y, noise_scale=0.3)
    np.testing.assert_allclose(exact.inclusion, ref.inclusion_dense(x, y, 0.5, 1.0, 0.3), rtol=1e-9)


def test_exact_argument_table():
    x, y = _tiny_problem()
    for kwargs, name in (
        ({"slab_scale": float("inf")}, "slab_scale"),  # used to give NaN
        ({"slab_scale": float("nan")}, "slab_scale"),
        ({"noise_scale": float("inf")}, "noise_scale"),
        ({"noise_scale": -1.0}, "noise_scale"),
        ({"prior_inclusion": float("nan")}, "prior_inclusion"),
    ):
        with pytest.raises(ValueError, match=f"exact_inclusion_probabilities: {name} must be"):
            exact_inclusion_probabilities(x, y, **kwargs)
    with pytest.raises(TypeError, match="slab_scale"):
        exact_inclusion_probabilities(x, y, slab_scale="1")
    with pytest.raises(ValueError, match="finite"):
        exact_inclusion_probabilities(x, np.full_like(y, np.nan))


def test_variational_inclusion_agrees_with_exact_on_diabetes(diabetes_mean_field):
    """Gaussian-slab SVI and the exact conjugate model agree on every clear-cut feature.

    Same prior inclusion (0.5), slab scale (1.0) and fixed noise (OLS residual scale) in both
    models; 300 full-batch epochs as ``python -m l0bayes`` (the fit of tests/conftest.py).
    """
    fit = diabetes_mean_field
    exact = exact_inclusion_probabilities(fit.x, fit.y, 0.5, 1.0, ols_noise_scale(fit.x, fit.y))
    vi = fit.model.inclusion_probabilities().double().numpy()
    clear = (exact.inclusion < 0.2) | (exact.inclusion > 0.8)
    assert clear.sum() >= 5  # age, sex, bmi, bp, s5, s6 on these data
    np.testing.assert_array_equal(
        (vi > 0.5)[clear],
        (exact.inclusion > 0.5)[clear],
        err_msg=f"exact {np.round(exact.inclusion, 3)} vs VI {np.round(vi, 3)}",
    )
