"""The free energy of Eq. 21 term by term, against a hand computation and against Pyro."""

import math

import numpy as np
import pytest
import torch
from pyro.infer import TraceMeanField_ELBO
from scipy import integrate

from l0bayes import HardConcrete
from l0bayes.inference import free_energy
from l0bayes.models import SparseLinearRegression, SparseLogisticRegression
from l0bayes.nn import gate_prior

B, L, U = 2 / 3, -0.1, 1.1


def _sig(x):
    return 1 / (1 + np.exp(-x))


def _hand_prob_nonzero(a):
    return _sig(a - B * math.log(-L / U))


def _hand_kl(aq, ap):
    """Eq. 28 by scipy quad with the raw Eq. 23/25 densities (independent of l0bayes)."""

    def atoms(a):
        return _sig(B * math.log(-L / U) - a), _sig(a - B * math.log((1 - L) / (U - 1)))

    def dens(z, a):
        s = (z - L) / (U - L)
        al = math.exp(a)
        return B * al * s ** (-B - 1) * (1 - s) ** (-B - 1) / (al * s ** (-B) + (1 - s) ** (-B)) ** 2 / (U - L)

    (q0, q1), (p0, p1) = atoms(aq), atoms(ap)
    cont, _ = integrate.quad(lambda z: dens(z, aq) * math.log(dens(z, aq) / dens(z, ap)), 0, 1, epsabs=1e-13)
    return q0 * math.log(q0 / p0) + q1 * math.log(q1 / p1) + cont


@pytest.fixture
def tiny():
    torch.manual_seed(0)
    x = torch.tensor([[1.0, -2.0], [0.5, 0.3], [-1.0, 1.5]], dtype=torch.float64)
    y = torch.tensor([0.7, -0.2, 1.1], dtype=torch.float64)
    m = SparseLinearRegression(2, noise_scale=0.8, prior_inclusion=0.3, code_cost=0.7).double()
    with torch.no_grad():
        m.gate.log_alpha.copy_(torch.tensor([1.5, -0.5]))
        m.weight.copy_(torch.tensor([0.9, -0.4]))
        m.bias.fill_(0.1)
    return m, x, y


def test_terms_match_hand_computation(tiny):
    m, x, y = tiny
    torch.manual_seed(3)
    terms = free_energy(m.model, m.guide, x, y, num_data=12)  # minibatch of 3 from N = 12
    torch.manual_seed(3)
    z = HardConcrete(m.gate.log_alpha.detach()).rsample().numpy()  # the same gate draw
    w, b = np.array([0.9, -0.4]) * z, 0.1
    resid = y.numpy() - (x.numpy() @ w + b)
    nll_batch = np.sum(0.5 * resid**2 / 0.8**2 + math.log(0.8) + 0.5 * math.log(2 * math.pi))
    prior_la = math.log(0.3 / 0.7) + B * math.log(-L / U)  # P(z != 0) = 0.3
    assert _hand_prob_nonzero(prior_la) == pytest.approx(0.3)
    kl = sum(_hand_kl(a, prior_la) for a in (1.5, -0.5))
    code = 0.7 * sum(_hand_prob_nonzero(a) for a in (1.5, -0.5))
    assert float(terms.nll.detach()) == pytest.approx(nll_batch * 12 / 3, rel=1e-10)
    assert float(terms.gate_kl.detach()) == pytest.approx(kl, rel=1e-8)
    assert float(terms.code_cost.detach()) == pytest.approx(code, rel=1e-12)
    assert float(terms.other_kl) == 0.0
    assert float(terms.total.detach()) == pytest.approx(nll_batch * 4 + kl + code, rel=1e-9)


def test_penalized_objective_drops_only_the_kl_and_is_a_lower_bound(tiny):
    """Eq. 22: the same call with the KL switched off; F >= the penalised objective."""
    m, x, y = tiny
    torch.manual_seed(5)
    full = free_energy(m.model, m.guide, x, y)
    torch.manual_seed(5)
    pen = free_energy(m.model, m.guide, x, y, kl=False)
    assert float(pen.gate_kl) == 0.0
    assert float(pen.nll) == float(full.nll) and float(pen.code_cost) == float(full.code_cost)
    assert float(full.total) >= float(pen.total) + 0.9 * float(full.gate_kl) > float(pen.total)


@pytest.mark.parametrize("slab", ["point", "gaussian"])
@pytest.mark.parametrize("cls", [SparseLinearRegression, SparseLogisticRegression])
def test_trace_mean_field_elbo_gives_the_same_objective(slab, cls):
    torch.manual_seed(0)
    x = torch.randn(20, 4)
    y = (torch.rand(20) < 0.5).float() if cls is SparseLogisticRegression else torch.randn(20)
    m = cls(4, slab=slab, prior_inclusion=0.2)
    with torch.no_grad():
        m.weight.normal_()
    for seed in range(3):
        torch.manual_seed(seed)
        ours = free_energy(m.model, m.guide, x, y, 100).total
        torch.manual_seed(seed)
        theirs = TraceMeanField_ELBO().differentiable_loss(m.model, m.guide, x, y, 100)
        assert float(ours) == pytest.approx(float(theirs), rel=1e-5)


def test_gaussian_slab_cost_is_eq20():
    """Code cost of the Gaussian slab: sum_j q(z_j != 0) KL(N(mu, s^2) || N(0, prior_scale^2))."""
    m = SparseLinearRegression(3, slab="gaussian", prior_scale=2.0).double()
    with torch.no_grad():
        m.weight.copy_(torch.tensor([0.5, -1.0, 3.0]))
        m.slab_log_scale.copy_(torch.log(torch.tensor([0.1, 0.5, 1.0], dtype=torch.float64)))
        m.gate.log_alpha.copy_(torch.tensor([-1.0, 0.0, 2.0]))
    x, y = torch.randn(5, 3, dtype=torch.float64), torch.randn(5, dtype=torch.float64)
    terms = free_energy(m.model, m.guide, x, y)
    mu, s, a = np.array([0.5, -1.0, 3.0]), np.array([0.1, 0.5, 1.0]), np.array([-1.0, 0.0, 2.0])
    kl_normal = np.log(2.0 / s) + (s**2 + mu**2) / (2 * 4.0) - 0.5
    assert float(terms.code_cost) == pytest.approx(float(np.sum(_hand_prob_nonzero(a) * kl_normal)), rel=1e-10)


def test_gate_prior_from_inclusion_and_bad_arguments():
    assert float(gate_prior(0.1).prob_nonzero) == pytest.approx(0.1, rel=1e-6)
    with pytest.raises(ValueError, match="prior_inclusion"):
        gate_prior(1.5)
    with pytest.raises(ValueError, match="exactly one"):
        gate_prior()
    with pytest.raises(ValueError, match="slab"):
        SparseLinearRegression(3, slab="laplace")
    m = SparseLinearRegression(3)
    with pytest.raises(ValueError, match="features"):
        free_energy(m.model, m.guide, torch.randn(4, 2), torch.randn(4))
    with pytest.raises(ValueError, match="NaN"):
        free_energy(m.model, m.guide, torch.full((4, 3), float("nan")), torch.randn(4))
    with pytest.raises(ValueError, match="shape"):
        free_energy(m.model, m.guide, torch.randn(4, 3), torch.randn(5))
    logistic = SparseLogisticRegression(3)
    with pytest.raises(ValueError, match="labels"):
        free_energy(logistic.model, logistic.guide, torch.randn(4, 3), torch.tensor([0.0, 1.0, 2.0, 1.0]))
