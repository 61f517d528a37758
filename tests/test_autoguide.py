"""AutoHardConcrete: a Pyro autoguide for hard concrete sites that, unlike AutoNormal, prunes."""

import math

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import SVI, Trace_ELBO, TraceMeanField_ELBO
from pyro.infer.autoguide import AutoDelta, AutoNormal
from scipy.integrate import quad

from l0bayes import HardConcrete
from l0bayes.models import AutoHardConcrete, auto_guide_list

N, P = 200, 5


def _kl_by_quad(aq, ap, b, lo, hi):
    """Eq. 28 from the raw densities of Eq. 23/25 and the atoms of Eq. 26, by SciPy quadrature."""

    def atoms(a):
        p0 = 1 / (1 + math.exp(-(b * math.log(-lo / hi) - a)))
        p1 = 1 / (1 + math.exp(-(a - b * math.log((1 - lo) / (hi - 1)))))
        return p0, p1

    def density(z, a):
        s = (z - lo) / (hi - lo)
        alpha = math.exp(a)
        return b * alpha * s ** (-b - 1) * (1 - s) ** (-b - 1) / (alpha * s ** (-b) + (1 - s) ** (-b)) ** 2 / (hi - lo)

    (q0, q1), (p0, p1) = atoms(aq), atoms(ap)
    cont, _ = quad(lambda z: density(z, aq) * math.log(density(z, aq) / density(z, ap)), 0, 1, epsabs=1e-13)
    return q0 * math.log(q0 / p0) + q1 * math.log(q1 / p1) + cont


def test_gates_only_model_loss_is_the_exact_kl():
    """The guide takes the temperature and stretch of the site's prior: its KL matches quadrature."""
    b, lo, hi, prior_la = 0.5, -0.2, 1.05, -1.0

    def model():
        prior = HardConcrete(torch.tensor(prior_la, dtype=torch.float64), b, lo, hi)
        pyro.sample("gates", prior.expand([3]).to_event(1))

    pyro.clear_param_store()
    guide = AutoHardConcrete(model, init_drop_rate=0.3)
    guide()
    q = guide.distributions()["gates"]
    assert torch.all(q.temperature == b) and torch.all(q.lower == lo) and torch.all(q.upper == hi)
    log_alpha = q.log_alpha
    assert log_alpha.shape == (3,) and log_alpha.dtype == torch.float64
    assert torch.allclose(log_alpha, torch.full((3,), math.log(0.7 / 0.3), dtype=torch.float64), atol=0.05)
    loss = TraceMeanField_ELBO().differentiable_loss(model, guide)
    expected = sum(_kl_by_quad(float(a), prior_la, b, lo, hi) for a in log_alpha)
    assert float(loss.detach()) == pytest.approx(expected, rel=1e-6)


def _regression_data():
    torch.manual_seed(0)
    x = torch.randn(N, P, dtype=torch.float64)
    y = 2.0 * x[:, 0] - 1.5 * x[:, 1] + 0.5 * torch.randn(N, dtype=torch.float64)
    return x, y


def _model(x, y):
    z = pyro.sample("z", HardConcrete(torch.tensor(-2.0, dtype=torch.float64)).expand([P]).to_event(1))
    w = pyro.sample("w", dist.Normal(torch.zeros(P, dtype=torch.float64), 2.0).to_event(1))
    with pyro.plate("data", x.shape[0]):
        pyro.sample("y", dist.Normal(x @ (w * z), 0.5), obs=y)


def _fit(guide, x, y, steps):
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    svi = SVI(_model, guide, pyro.optim.Adam({"lr": 0.05}), Trace_ELBO())
    for _ in range(steps):
        svi.step(x, y)
    with torch.no_grad():
        return torch.stack([guide(x, y)["z"] for _ in range(200)])


def test_auto_guide_list_selects_features_with_exact_zeros(one_thread):
    x, y = _regression_data()
    guide = auto_guide_list(_model)  # AutoHardConcrete for "z", AutoNormal for "w"
    draws = _fit(guide, x, y, 400)  # (the noise features: q(z != 0) at most 0.31, z == 0 in 72% of draws)
    gates = guide[0]
    assert set(gates.distributions()) == {"z"}  # "w" is left to AutoNormal
    assert isinstance(guide[1], AutoNormal)
    q = gates.prob_nonzero()["z"]
    assert torch.all(q[:2] > 0.95) and torch.all(q[2:] < 0.5)
    assert torch.equal(gates.median()["z"][2:], torch.zeros(P - 2, dtype=torch.float64))  # pruned at test time
    zero_fraction = (draws == 0).double().mean(0)
    assert torch.all(zero_fraction[2:] > 0.4) and torch.all(zero_fraction[:2] < 0.05)


@pytest.mark.parametrize("autoguide", [AutoNormal, AutoDelta])
def test_pyro_autoguides_never_give_an_exact_zero(autoguide, one_thread):
    """Why AutoHardConcrete exists: Pyro's autoguides map the unit interval through a sigmoid."""
    x, y = _regression_data()
    draws = _fit(autoguide(_model), x, y, 30)
    assert not torch.any(draws == 0)


def test_auto_guide_list_with_delta_and_bad_drop_rate():
    x, y = _regression_data()
    pyro.clear_param_store()
    guide = auto_guide_list(_model, other=AutoDelta)
    out = guide(x, y)
    assert set(out) == {"z", "w"} and out["z"].shape == (P,)
    with pytest.raises(ValueError, match="AutoHardConcrete: init_drop_rate must be"):
        AutoHardConcrete(_model, init_drop_rate=1.5)
    with pytest.raises(RuntimeError, match="call the guide once"):
        AutoHardConcrete(_model).distributions()
