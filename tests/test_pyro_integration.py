"""HardConcrete inside Pyro: sample sites, TraceMeanField_ELBO with the registered KL, SVI."""

import math

import pyro
import pyro.optim
import pytest
import torch
from pyro.infer import SVI, Trace_ELBO, TraceMeanField_ELBO

from l0bayes import HardConcrete

D = 4


def _sigmoid(x):
    return 1.0 / (1.0 + math.exp(-x))


def _scipy_kl(aq, ap, b=2 / 3, lo=-0.1, hi=1.1):
    """Eq. 28 by scipy quad over z in (0, 1) with the raw densities of Eq. 23/25."""
    from scipy.integrate import quad

    def atoms(a):
        p0 = _sigmoid(b * math.log(-lo / hi) - a)
        p1 = _sigmoid(a - b * math.log((1 - lo) / (hi - 1)))
        return p0, p1

    def density(z, a):
        s = (z - lo) / (hi - lo)
        alpha = math.exp(a)
        num = b * alpha * s ** (-b - 1) * (1 - s) ** (-b - 1)
        return num / (alpha * s ** (-b) + (1 - s) ** (-b)) ** 2 / (hi - lo)

    q0, q1 = atoms(aq)
    p0, p1 = atoms(ap)
    cont, _ = quad(lambda z: density(z, aq) * math.log(density(z, aq) / density(z, ap)), 0, 1, epsabs=1e-13)
    return q0 * math.log(q0 / p0) + q1 * math.log(q1 / p1) + cont


def _model(prior_log_alpha):
    def model():
        pyro.sample("z", HardConcrete(torch.tensor(prior_log_alpha, dtype=torch.float64)).expand([D]).to_event(1))

    return model


def _guide(init):
    def guide():
        log_alpha = pyro.param("log_alpha", init.clone())
        pyro.sample("z", HardConcrete(log_alpha).to_event(1))

    return guide


def test_pyro_sample_site_has_exact_zeros_and_log_prob():
    pyro.set_rng_seed(0)
    trace = pyro.poutine.trace(_model(0.0)).get_trace()
    site = trace.nodes["z"]
    assert site["value"].shape == (D,)
    assert isinstance(site["fn"].base_dist, HardConcrete)  # expand kept the type
    trace.compute_log_prob()
    assert torch.isfinite(site["log_prob"]).all()


def test_mean_field_elbo_equals_analytic_kl_when_nothing_observed():
    pyro.clear_param_store()
    init = torch.tensor([-2.0, 0.0, 1.5, 4.0], dtype=torch.float64)
    elbo = TraceMeanField_ELBO()
    loss = elbo.loss(_model(-1.0), _guide(init))
    expected = sum(_scipy_kl(float(a), -1.0) for a in init)
    assert loss == pytest.approx(expected, rel=1e-8)
    # Analytic, not Monte Carlo: the loss does not depend on the random draw.
    assert elbo.loss(_model(-1.0), _guide(init)) == loss


def test_trace_elbo_monte_carlo_agrees_with_analytic_kl():
    """Trace_ELBO estimates the same KL by sampling; it must agree within its Monte Carlo error."""
    pyro.clear_param_store()
    pyro.set_rng_seed(1)
    init = torch.tensor([-2.0, 0.0, 1.5, 4.0], dtype=torch.float64)
    # Per-draw values of log q(z) - log p(z); their mean estimates the KL.
    guide_dist = HardConcrete(init)
    prior = HardConcrete(torch.tensor(-1.0, dtype=torch.float64))
    z = guide_dist.sample((20000,))
    draws = (guide_dist.log_prob(z) - prior.log_prob(z)).sum(-1)
    expected = sum(_scipy_kl(float(a), -1.0) for a in init)
    stderr = draws.std().item() / math.sqrt(draws.numel())
    assert abs(draws.mean().item() - expected) < 5 * stderr
    loss = Trace_ELBO(num_particles=4000, vectorize_particles=True).loss(_model(-1.0), _guide(init))
    assert abs(loss - expected) < 5 * draws.std().item() / math.sqrt(4000)


def test_svi_moves_guide_to_prior():
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    prior_log_alpha = -1.0
    init = torch.tensor([-3.0, 0.0, 2.0, 4.0], dtype=torch.float64)
    svi = SVI(_model(prior_log_alpha), _guide(init), pyro.optim.Adam({"lr": 0.1}), TraceMeanField_ELBO())
    first = svi.step()
    for _ in range(199):
        last = svi.step()
    fitted = pyro.param("log_alpha").detach()
    assert torch.allclose(fitted, torch.full_like(fitted, prior_log_alpha), atol=0.05)
    assert last < 1e-3 < first


def test_regression_models_are_pyro_modules_trained_by_pyro_svi():
    """``model``/``guide`` are Pyro methods: Pyro's own SVI with a pyro.optim optimiser trains the module."""
    from pyro.infer import SVI
    from pyro.nn import PyroModule

    from l0bayes.models import SparseLinearRegression

    pyro.clear_param_store()
    torch.manual_seed(0)
    x = torch.randn(200, 6)
    y = x @ torch.tensor([2.0, -1.5, 0.0, 0.0, 0.0, 0.0]) + 0.3 * torch.randn(200)
    m = SparseLinearRegression(6, prior_inclusion=0.3, noise_scale=0.3)
    assert isinstance(m, PyroModule)
    before = m.gate.log_alpha.detach().clone()
    svi = SVI(m.model, m.guide, pyro.optim.Adam({"lr": 0.05}), TraceMeanField_ELBO())
    for _ in range(300):
        svi.step(x, y)
    assert pyro.param("weight") is m.weight  # the module's own parameters are the ones in the store
    assert not torch.equal(m.gate.log_alpha.detach(), before)
    pi = m.inclusion_probabilities()
    # Started at about 0.5 everywhere: the true coefficients are in, the null ones on their way out.
    assert pi[:2].min() > 0.9 and pi[2:].mean() < 0.45, pi
    pyro.clear_param_store()
