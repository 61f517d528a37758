"""The fused training paths give the same numbers as the per-gate / Pyro computations they replace."""

import pyro
import pytest
import torch
from pyro.infer import TraceMeanField_ELBO

from l0bayes import HardConcrete
from l0bayes.models import SparseClassifier
from l0bayes.nn import L0MLP, HardConcreteGate, L0Linear
from l0bayes.nn.gate_set import GateSet
from l0bayes.nn.gates import hard_concrete_rsample


def _classifier(lam=0.1, dtype=torch.float64, weight_decay=0.0, device="cpu"):
    torch.manual_seed(1)
    net = L0MLP(20, (16, 8), 3).to(dtype=dtype, device=device)
    with torch.no_grad():  # spread the gates over open, closed and undecided
        for gate in (m for m in net.modules() if isinstance(m, HardConcreteGate)):
            gate.log_alpha.copy_(torch.linspace(-4.0, 5.0, gate.num_gates, dtype=dtype, device=device))
    return SparseClassifier(net, lam=lam, weight_decay=weight_decay, prior_inclusion=0.3)


def _data(dtype=torch.float64, n=32, device="cpu"):
    g = torch.Generator().manual_seed(2)
    x, y = torch.randn(n, 20, generator=g, dtype=dtype), torch.randint(0, 3, (n,), generator=g)
    return x.to(device), y.to(device)


def test_hard_concrete_rsample_equals_distribution_rsample(device):
    log_alpha = torch.linspace(-6.0, 6.0, 50, dtype=torch.float64, device=device)
    torch.manual_seed(3)
    fast = hard_concrete_rsample(log_alpha, 0.5, -0.2, 1.3)
    torch.manual_seed(3)
    slow = HardConcrete(log_alpha, 0.5, -0.2, 1.3).rsample()
    torch.testing.assert_close(fast, slow, rtol=1e-14, atol=1e-15)


def test_gate_methods_equal_the_distribution():
    gate = HardConcreteGate(40, temperature=0.4, lower=-0.3, upper=1.2).double()
    with torch.no_grad():
        gate.log_alpha.copy_(torch.linspace(-9.0, 9.0, 40, dtype=torch.float64))
    d = gate.distribution()
    torch.testing.assert_close(gate.prob_nonzero(), d.prob_nonzero, rtol=1e-13, atol=1e-300)
    torch.testing.assert_close(gate.deterministic(), d.deterministic_gate, rtol=1e-13, atol=1e-15)


def _means_agree(draw_a, draw_b, draws=400):
    """Monte Carlo: the means of two samplers of the same tensor agree within 5 standard errors, element by
    element (CUDA's Philox generator: one fused draw of ``n1 + n2`` numbers is not two draws of ``n1`` and
    ``n2``, so there the fused and the per-gate paths agree in law, not draw by draw)."""
    with torch.no_grad():
        a = torch.stack([draw_a() for _ in range(draws)]).double()
        b = torch.stack([draw_b() for _ in range(draws)]).double()
    standard_error = ((a.var(0) + b.var(0)) / draws).sqrt()
    assert ((a.mean(0) - b.mean(0)).abs() <= 5 * standard_error + 1e-9).all()


def test_gate_set_sampled_equals_per_gate_draws(device):
    """One draw for all gates: the same random stream as drawing gate by gate (on the CPU; the same law on
    CUDA, whose generator gives one long draw other numbers than several short ones)."""
    model = _classifier(device=device)
    gates = [m for m in model.net.modules() if isinstance(m, HardConcreteGate)]
    if device.type == "cuda":

        def fused():
            with model._gate_set.sampled():
                return torch.cat([g() for g in gates])

        _means_agree(lambda: torch.cat([g() for g in gates]), fused)
        return
    torch.manual_seed(4)
    per_gate = [g() for g in gates]
    torch.manual_seed(4)
    with model._gate_set.sampled():
        fused = [g() for g in gates]
    for a, b in zip(per_gate, fused, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-14, atol=1e-15)
    assert all(g._value is None for g in gates)  # reset on exit


def test_gate_set_groups_by_hyper_parameters():
    net = torch.nn.Sequential(
        L0Linear(6, 5, temperature=0.5), torch.nn.ReLU(), L0Linear(5, 4), L0Linear(4, 2, temperature=0.5)
    )
    gs = GateSet(net)
    assert [g.names for g in gs.groups] == [["0.gate", "3.gate"], ["2.gate"]]
    weights = {"0.gate": 0.5, "2.gate": 2.0}
    expected = sum(
        weights.get(name, 0.0) * layer.gate.expected_l0()
        for name, layer in (("0.gate", net[0]), ("2.gate", net[2]), ("3.gate", net[3]))
    )
    torch.testing.assert_close(gs.weighted_l0(gs.log_alphas(), weights), expected)
    with pytest.raises(ValueError, match="no HardConcreteGate"):
        GateSet(torch.nn.Linear(2, 2))


def test_code_cost_equals_per_layer_sum():
    model = _classifier(lam={"fc1": 0.3, "fc3": 2.0}, weight_decay=0.0)
    expected = 0.3 * model.net.fc1.gate.expected_l0() + 2.0 * model.net.fc3.gate.expected_l0()
    torch.testing.assert_close(model.code_cost(), expected, rtol=1e-13, atol=0)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_bayes_loss_equals_trace_mean_field_elbo(dtype, device):
    """Eq. 21 computed directly equals Pyro's TraceMeanField_ELBO loss (analytic KL) on the same draws (on the
    CPU; on CUDA, whose fused draw is not the per-site draws, in mean, and the KL term exactly)."""
    model = _classifier(dtype=dtype, device=device)
    x, y = _data(dtype, device=device)
    num_data = 1000
    if device.type == "cuda":
        elbo = TraceMeanField_ELBO()
        _means_agree(
            lambda: elbo.differentiable_loss(model.model, model.guide, x, y, num_data).reshape(1),
            lambda: sum(model.bayes_loss(x, y, num_data)).reshape(1),
        )
    torch.manual_seed(5)
    pyro.clear_param_store()
    pyro_loss = TraceMeanField_ELBO().differentiable_loss(model.model, model.guide, x, y, num_data)
    pyro_grads = torch.autograd.grad(pyro_loss, list(model.parameters()))
    torch.manual_seed(5)
    nll, kl, cost = model.bayes_loss(x, y, num_data)
    fast = nll + kl + cost
    fast_grads = torch.autograd.grad(fast, list(model.parameters()))
    tol = {"rtol": 1e-11, "atol": 1e-9} if dtype == torch.float64 else {"rtol": 2e-5, "atol": 1e-3}
    if device.type != "cuda":
        torch.testing.assert_close(fast, pyro_loss, **tol)
        for a, b in zip(fast_grads, pyro_grads, strict=True):
            torch.testing.assert_close(a, b, **tol)
    # The KL term alone against the distribution-level KL, gate by gate.
    expected_kl = sum(
        torch.distributions.kl_divergence(g.distribution(), model._gate_prior(g).expand((g.num_gates,))).sum()
        for _, g in model._gates
    )
    torch.testing.assert_close(kl, expected_kl, **tol)


def test_penalized_loss_in_eval_mode_uses_test_time_gates():
    model = _classifier().eval()
    x, y = _data()
    nll1, _ = model.penalized_loss(x, y, 100)
    nll2, _ = model.penalized_loss(x, y, 100)
    torch.testing.assert_close(nll1, nll2, rtol=0, atol=0)  # deterministic (Eq. 13)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_log_prob_with_scalar_parameters_matches_reference(dtype):
    """The lean log_prob (single temperature and stretch) against mpmath, atoms and density, with gradients."""
    import hc_reference as ref

    b, lo, hi = 0.4, -0.2, 1.3
    log_alpha = torch.tensor([-25.0, -3.0, -0.5, 0.0, 1.7, 6.0, 25.0], dtype=dtype, requires_grad=True)
    values = torch.tensor([0.0, 1.0, 1e-6, 0.3, 0.5, 0.999, 1.0 - 2**-20, -0.1, 1.5], dtype=dtype)
    d = HardConcrete(log_alpha, b, lo, hi, validate_args=False)
    lp = d.log_prob(values.unsqueeze(-1))  # (9, 7): every value against every gate
    expected = [[ref.mp_log_prob(float(z), float(a), b, lo, hi) for a in log_alpha.tolist()] for z in values.tolist()]
    expected = torch.tensor(expected, dtype=torch.float64)
    finite = torch.isfinite(expected)
    assert torch.equal(torch.isfinite(lp), finite) and torch.all(lp[~finite] == -torch.inf)
    rtol = 1e-12 if dtype == torch.float64 else 2e-6
    torch.testing.assert_close(lp.double()[finite], expected[finite], rtol=rtol, atol=rtol)
    # The gradient equals the general (per-gate parameter) path's, which autograd differentiates.
    per_gate = [torch.full_like(log_alpha, v).detach() for v in (b, lo, hi)]  # not single values: general path
    general = HardConcrete(log_alpha, *per_gate, validate_args=False)
    lp_general = general.log_prob(values.unsqueeze(-1))
    torch.testing.assert_close(lp, lp_general, rtol=rtol, atol=rtol)
    weights = torch.where(torch.isfinite(lp), 1.0, 0.0).to(dtype)
    (g,) = torch.autograd.grad(lp.where(weights > 0, 0.0).mul(weights).sum(), log_alpha)
    (g_general,) = torch.autograd.grad(lp_general.where(weights > 0, 0.0).mul(weights).sum(), log_alpha)
    torch.testing.assert_close(g, g_general, rtol=rtol, atol=rtol)


@pytest.mark.parametrize("prior_stretch", [(-0.1, 1.1), (-0.2, 1.05)])  # the gates' own stretch, another
def test_gate_set_kl_matches_the_reference(prior_stretch, device):
    # The fused KL (floats, no distribution objects when the prior shares the gates' stretch; the general
    # path otherwise) against Eq. 28 from the independent mpmath/quadrature reference, gate by gate.
    import hc_reference as ref

    net = torch.nn.Sequential(L0Linear(4, 3), torch.nn.ReLU(), L0Linear(3, 2)).double().to(device)
    log_alphas = [torch.tensor([-3.0, -0.5, 1.0, 4.0]), torch.tensor([0.2, 2.5, -1.5])]
    with torch.no_grad():
        for layer, values in zip((net[0], net[2]), log_alphas, strict=True):
            layer.gate.log_alpha.copy_(values)
    prior = HardConcrete(torch.tensor(-0.7, dtype=torch.float64, device=device), 0.5, *prior_stretch)
    gs = GateSet(net)
    for _ in range(2):  # the second call uses the cached prior scalars
        kl = gs.kl(gs.log_alphas(), lambda *_: prior)
    expected = sum(
        ref.kl((a, 2.0 / 3.0, -0.1, 1.1), (-0.7, 0.5, *prior_stretch))[0] for a in torch.cat(log_alphas).tolist()
    )
    assert abs(float(kl) - expected) <= 1e-9 * max(1.0, abs(expected))


def _noise_from_the_cpu(monkeypatch):
    """Gate noise drawn by the CPU generator on every device: the same draws on CPU and CUDA."""
    from l0bayes.distributions import stretched_concrete

    draw = stretched_concrete.standard_logistic
    monkeypatch.setattr(
        stretched_concrete, "standard_logistic", lambda shape, dtype, device: draw(shape, dtype, "cpu").to(device)
    )


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_fused_losses_on_cuda_equal_the_cpu(dtype, cuda_device, monkeypatch):
    """bayes_loss and penalized_loss (Eq. 21, 22) and their gradients: CUDA against the CPU, same gate draws."""
    _noise_from_the_cpu(monkeypatch)
    results = []
    for device in ("cpu", cuda_device):
        model = _classifier(dtype=dtype, device=device, weight_decay=0.01)
        x, y = _data(dtype, n=64, device=device)
        row = []
        for loss in (model.bayes_loss, model.penalized_loss):
            torch.manual_seed(9)
            terms = loss(x, y, 1000)
            grads = torch.autograd.grad(sum(terms), list(model.parameters()))
            row += [t.detach().cpu() for t in (*terms, *grads)]
        results.append(row)
    tol = {"rtol": 1e-10, "atol": 1e-10} if dtype == torch.float64 else {"rtol": 1e-4, "atol": 1e-4}
    for on_cpu, on_cuda in zip(*results, strict=True):
        torch.testing.assert_close(on_cuda, on_cpu, **tol)
