"""Tests of the hard concrete KL divergence (Appendix C, Eq. 28) against an independent reference.

The reference (``hc_reference.kl``) is Eq. 28 with the atoms from mpmath and the continuous part
``int_0^1 qbar log(qbar / pbar)`` by ``scipy.integrate.quad`` of the float64 Eq. 23-25.
"""

import itertools
import math
import random

import hc_reference as ref
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.distributions import Beta, kl_divergence

from l0bayes import HardConcrete, kl_hard_concrete

LOG_ALPHAS = [-30.0, -3.0, 0.0, 2.5, 30.0]
TEMPERATURES = [0.05, 2.0 / 3.0, 5.0]
STRETCHES = [(-0.1, 1.1), (-0.3, 1.4), (-0.5, 1.2)]
PARAMS = [(a, b, l, u) for a, b, (l, u) in itertools.product(LOG_ALPHAS, TEMPERATURES, STRETCHES)]

# Pairs that must be there: the example of the brief (different temperature and stretch, both
# ways round), p's stretch narrower than q's (the hard case for quadrature in q's variable),
# and the extremes.
CURATED = [
    ((1.0, 2.0 / 3.0, -0.1, 1.1), (-2.0, 0.3, -0.3, 1.4)),
    ((-2.0, 0.3, -0.3, 1.4), (1.0, 2.0 / 3.0, -0.1, 1.1)),
    ((0.0, 2.0 / 3.0, -0.5, 1.2), (0.0, 0.3, -0.05, 1.05)),
    ((8.0, 3.0, -0.1, 1.1), (3.0, 2.0 / 3.0, -0.01, 1.01)),
    ((30.0, 0.05, -0.3, 1.4), (30.0, 0.05, -0.1, 1.1)),
    ((30.0, 0.05, -0.1, 1.1), (-30.0, 5.0, -0.1, 1.1)),
    ((-30.0, 5.0, -0.5, 1.2), (30.0, 0.05, -0.1, 1.1)),
    ((-30.0, 0.05, -0.1, 1.1), (-30.0, 5.0, -0.1, 1.1)),
    ((30.0, 5.0, -0.1, 1.1), (30.0, 0.05, -0.3, 1.4)),
    ((0.0, 2.0 / 3.0, -0.1, 1.1), (0.0, 2.0 / 3.0, -0.1, 1.1)),
]
_rng = random.Random(20180101)
SAME_STRETCH = [(q, p) for q, p in itertools.product(PARAMS, PARAMS) if q[2:] == p[2:]]
DIFFERENT_STRETCH = [(q, p) for q, p in itertools.product(PARAMS, PARAMS) if q[2:] != p[2:]]
PAIRS = CURATED + _rng.sample(SAME_STRETCH, 45) + _rng.sample(DIFFERENT_STRETCH, 60)


def gate(params, dtype=torch.float64, device="cpu"):
    a, b, l, u = params
    return HardConcrete(torch.tensor(a, dtype=dtype, device=device), b, l, u)


def batched(params_list, dtype=torch.float64, device="cpu"):
    cols = [torch.tensor(c, dtype=dtype, device=device) for c in zip(*params_list)]
    return HardConcrete(*cols)


def reference(pairs):
    return np.array([ref.kl(q, p)[0] for q, p in pairs])


# ============================================================================ zero, sign
def test_kl_of_a_gate_with_itself_is_zero():
    d = batched(PARAMS)
    same = kl_hard_concrete(d, d)
    assert same.shape == (len(PARAMS),)
    np.testing.assert_allclose(same.numpy(), 0.0, rtol=0, atol=1e-12)
    copy = batched(PARAMS)  # equal parameters, different objects
    np.testing.assert_allclose(kl_hard_concrete(d, copy).numpy(), 0.0, rtol=0, atol=1e-12)
    for params in PARAMS[::4]:
        assert abs(kl_hard_concrete(gate(params), gate(params)).item()) <= 1e-12


def test_kl_nonnegative_over_grid():
    q = batched([q for q, _ in SAME_STRETCH + DIFFERENT_STRETCH[::3]])
    p = batched([p for _, p in SAME_STRETCH + DIFFERENT_STRETCH[::3]])
    values = kl_hard_concrete(q, p)
    assert torch.isfinite(values).all()
    assert (values >= -1e-13).all(), values.min()
    assert (values > 0).float().mean() > 0.9


@settings(max_examples=50, deadline=None, derandomize=True, database=None)
@given(
    a=st.tuples(st.floats(-12, 12), st.floats(-12, 12)),
    b=st.tuples(st.floats(0.05, 5.0), st.floats(0.05, 5.0)),
    l=st.tuples(st.floats(-0.8, -0.01), st.floats(-0.8, -0.01)),
    u=st.tuples(st.floats(1.01, 1.8), st.floats(1.01, 1.8)),
)
def test_kl_nonnegative_property(a, b, l, u):
    q = HardConcrete(torch.tensor(a[0], dtype=torch.float64), b[0], l[0], u[0])
    p = HardConcrete(torch.tensor(a[1], dtype=torch.float64), b[1], l[1], u[1])
    value = kl_hard_concrete(q, p).item()
    assert math.isfinite(value)
    assert value >= -1e-12


# ============================================================================ vs reference
def _check_float64(actual, pairs):
    """1e-9 relative; pairs with q == p (KL exactly 0) to 1e-12 absolute."""
    expected = reference(pairs)
    zero = expected == 0
    np.testing.assert_allclose(actual[~zero], expected[~zero], rtol=1e-9, atol=1e-300)
    np.testing.assert_allclose(actual[zero], 0.0, rtol=0, atol=1e-12)


def test_kl_matches_reference_pairwise():
    """Each pair on its own (the quadrature size is chosen for that pair alone)."""
    actual = np.array([kl_hard_concrete(gate(q), gate(p)).item() for q, p in PAIRS])
    _check_float64(actual, PAIRS)


def test_kl_matches_reference_batched(device):
    same = CURATED[-2:] + [pair for pair in PAIRS if pair[0][2:] == pair[1][2:]]
    for pairs in (same, PAIRS):  # one stretch on both sides; mixed stretches
        q, p = batched([q for q, _ in pairs], device=device), batched([p for _, p in pairs], device=device)
        _check_float64(kl_hard_concrete(q, p).cpu().numpy(), pairs)


def test_kl_same_stretch_in_batch_with_different_values():
    """Same stretch *per element* but not the same tensor across the batch."""
    pairs = [pair for pair in PAIRS if pair[0][2:] == pair[1][2:]]
    q, p = batched([q for q, _ in pairs]), batched([p for _, p in pairs])
    assert len({pair[0][2:] for pair in pairs}) > 1
    _check_float64(kl_hard_concrete(q, p).numpy(), pairs)


def test_kl_float32(device):
    q = batched([q for q, _ in PAIRS], dtype=torch.float32, device=device)
    p = batched([p for _, p in PAIRS], dtype=torch.float32, device=device)
    actual = kl_hard_concrete(q, p)
    assert actual.dtype == torch.float32 and actual.device.type == torch.device(device).type
    actual = actual.double().cpu().numpy()
    expected = reference(PAIRS)
    err = np.abs(actual - expected)
    ok = (err <= 1e-5 * np.abs(expected)) | (err <= 1e-6)
    assert ok.all(), list(zip(np.array(PAIRS, dtype=object)[~ok], actual[~ok], expected[~ok]))
    single = np.array(
        [kl_hard_concrete(gate(q, torch.float32, device), gate(p, torch.float32, device)).item() for q, p in PAIRS]
    )
    err = np.abs(single - expected)
    assert ((err <= 1e-5 * np.abs(expected)) | (err <= 1e-6)).all()


# ============================================================================ shared-parameter fast path
# A layer's gates against a fixed prior: one temperature and stretch for all, only log_alpha varies.
SHARED_CASES = [
    (2.0 / 3.0, 2.0 / 3.0, -1.5, (-0.1, 1.1)),  # the paper's gates against a prior
    (0.05, 5.0, 3.0, (-0.1, 1.1)),
    (5.0, 0.05, -30.0, (-0.3, 1.4)),
    (0.3, 2.0, 30.0, (-0.5, 1.2)),
]
SHARED_LOG_ALPHAS = [-30.0, -7.0, -1.0, 0.0, 0.4, 2.5, 9.0, 30.0]


def _shared_pair(bq, bp, ap, stretch, dtype, requires_grad=False, device="cpu"):
    a = torch.tensor(SHARED_LOG_ALPHAS, dtype=dtype, device=device, requires_grad=requires_grad)
    return a, HardConcrete(a, bq, *stretch), HardConcrete(torch.tensor(ap, dtype=dtype, device=device), bp, *stretch)


def _reference_shared(bq, bp, ap, stretch):
    return reference([((a, bq) + stretch, (ap, bp) + stretch) for a in SHARED_LOG_ALPHAS])


@pytest.mark.parametrize("case", SHARED_CASES)
def test_shared_parameter_kl_matches_reference(case, device):
    bq, bp, ap, stretch = case
    a, q, p = _shared_pair(bq, bp, ap, stretch, torch.float64, requires_grad=True, device=device)
    value = kl_divergence(q, p)
    assert type(value.grad_fn).__name__ == "_SharedParametersKLBackward"  # the fast path ran
    pairs = [((x, bq) + stretch, (ap, bp) + stretch) for x in SHARED_LOG_ALPHAS]
    _check_float64(value.detach().cpu().numpy(), pairs)
    a32, q32, p32 = _shared_pair(bq, bp, ap, stretch, torch.float32, device=device)
    expected = _reference_shared(bq, bp, ap, stretch)
    actual = kl_divergence(q32, p32).double().cpu().numpy()
    err = np.abs(actual - expected)
    assert ((err <= 1e-5 * np.abs(expected)) | (err <= 1e-6)).all(), (actual, expected)


@pytest.mark.parametrize("case", SHARED_CASES)
def test_shared_parameter_kl_gradient_matches_reference_derivative(case, device):
    """The closed-form gradient against central differences of the independent reference."""
    bq, bp, ap, stretch = case
    a, q, p = _shared_pair(bq, bp, ap, stretch, torch.float64, requires_grad=True, device=device)
    (grad,) = torch.autograd.grad(kl_divergence(q, p).sum(), a)
    h = 1e-5
    for x, g in zip(SHARED_LOG_ALPHAS, grad.tolist(), strict=True):
        up = ref.kl((x + h, bq) + stretch, (ap, bp) + stretch)[0]
        down = ref.kl((x - h, bq) + stretch, (ap, bp) + stretch)[0]
        np.testing.assert_allclose(g, (up - down) / (2 * h), rtol=1e-5, atol=1e-9)


def test_shared_parameter_kl_gradcheck_and_generic_path():
    a = torch.tensor([-3.0, -0.2, 0.7, 4.0], dtype=torch.float64, requires_grad=True)
    prior = HardConcrete(torch.tensor(-1.0, dtype=torch.float64), 0.5)
    assert torch.autograd.gradcheck(lambda x: kl_divergence(HardConcrete(x, 2.0 / 3.0), prior), (a,))
    # A learnable prior (or temperature) needs gradients the fast path does not give: generic path.
    ap = torch.tensor(-1.0, dtype=torch.float64, requires_grad=True)
    generic = kl_divergence(HardConcrete(a, 2.0 / 3.0), HardConcrete(ap, 0.5))
    assert type(generic.grad_fn).__name__ != "_SharedParametersKLBackward"
    fast = kl_divergence(HardConcrete(a, 2.0 / 3.0), prior)
    torch.testing.assert_close(fast, generic, rtol=1e-12, atol=1e-14)
    g_fast, g_generic = (torch.autograd.grad(v.sum(), a)[0] for v in (fast, generic))
    torch.testing.assert_close(g_fast, g_generic, rtol=1e-9, atol=1e-12)


def test_shared_parameter_kl_chunks_and_shapes(device):
    """Batches larger than one chunk, and a prior with a larger batch shape than q."""
    from l0bayes.distributions import quadrature

    a = torch.linspace(-8.0, 8.0, quadrature.CHUNK_SIZE + 37, dtype=torch.float64, device=device).reshape(-1, 1)
    prior = HardConcrete(torch.tensor(0.5, dtype=torch.float64, device=device))
    fast = kl_divergence(HardConcrete(a, 2.0 / 3.0), prior)
    assert fast.shape == a.shape
    generic = kl_hard_concrete(HardConcrete(a, 2.0 / 3.0), HardConcrete(torch.full_like(a, 0.5), 2.0 / 3.0))
    torch.testing.assert_close(fast, generic, rtol=1e-12, atol=1e-14)
    wide = kl_divergence(
        HardConcrete(torch.tensor([0.0, 1.0], dtype=torch.float64, device=device)), prior.expand((3, 2))
    )
    assert wide.shape == (3, 2)
    torch.testing.assert_close(wide[0], wide[2])


# ============================================================================ Monte Carlo
MC_PAIRS = [
    ((0.5, 2.0 / 3.0, -0.1, 1.1), (-1.0, 2.0 / 3.0, -0.1, 1.1)),
    ((1.0, 2.0 / 3.0, -0.1, 1.1), (-2.0, 0.3, -0.3, 1.4)),
    ((-2.0, 1.5, -0.5, 1.2), (0.5, 0.5, -0.2, 1.1)),
    ((-12.0, 0.2, -0.1, 1.1), (0.0, 2.0 / 3.0, -0.1, 1.1)),  # continuous part deep in a tail
]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("pair", MC_PAIRS)
def test_monte_carlo_agrees_with_quadrature(pair, dtype, device):
    torch.manual_seed(7)
    replicates, num_samples = 400, 500
    q = gate(pair[0], dtype, device).expand((replicates,))
    p = gate(pair[1], dtype, device).expand((replicates,))
    estimates = kl_hard_concrete(q, p, method="monte_carlo", num_samples=num_samples).double()
    assert estimates.shape == (replicates,)
    exact = ref.kl(*pair)[0]
    quadrature = kl_hard_concrete(gate(pair[0], dtype, device), gate(pair[1], dtype, device)).item()
    assert abs(quadrature - exact) <= 1e-5 * abs(exact) + 1e-6
    se = estimates.std().item() / math.sqrt(replicates)
    assert se > 0
    # plus the rounding of the (atom-dominated) estimate itself, where the continuous part is tiny
    rounding = 4 * torch.finfo(dtype).eps * abs(exact)
    assert abs(estimates.mean().item() - exact) < 4 * se + rounding, (estimates.mean().item(), exact, se)
    assert abs(estimates.mean().item() - quadrature) < 4 * se + rounding + 1e-5 * abs(exact)
    assert se < 0.05 * abs(exact) + 1e-3  # precise enough for the comparison to mean something


# ============================================================================ registration
def test_kl_divergence_is_registered():
    for q, p in PAIRS[:20]:
        assert kl_divergence(gate(q), gate(p)).item() == kl_hard_concrete(gate(q), gate(p)).item()


def test_kl_divergence_broadcasts_batch_shapes(device):
    qs = [(a, 2.0 / 3.0, -0.1, 1.1) for a in (-4.0, -1.0, 0.0, 1.5, 6.0)]
    p_params = (0.5, 0.5, -0.2, 1.3)
    q = batched(qs, device=device)
    p = gate(p_params, device=device)
    assert q.batch_shape == (5,) and p.batch_shape == ()
    expected = reference([(qq, p_params) for qq in qs])
    value = kl_divergence(q, p)
    assert value.shape == (5,)
    np.testing.assert_allclose(value.cpu().numpy(), expected, rtol=1e-9)
    np.testing.assert_allclose(kl_hard_concrete(q, p).cpu().numpy(), expected, rtol=1e-9)
    # p batched along another dimension: (3, 1) x (5,) -> (3, 5)
    p_list = [(x, 1.0, -0.2, 1.3) for x in (-2.0, 0.0, 2.0)]
    p3 = HardConcrete(torch.tensor([[x[0]] for x in p_list], dtype=torch.float64, device=device), 1.0, -0.2, 1.3)
    value = kl_divergence(q, p3)
    assert value.shape == (3, 5)
    expected = np.array([[ref.kl(qq, pp)[0] for qq in qs] for pp in p_list])
    np.testing.assert_allclose(value.cpu().numpy(), expected, rtol=1e-9)


def test_kl_divergence_after_expand():
    qs = [(a, 2.0 / 3.0, -0.1, 1.1) for a in (-4.0, 0.0, 6.0)]
    q = batched(qs).expand((2, 3))
    p = gate((0.5, 0.5, -0.2, 1.3)).expand((2, 3))
    assert type(q) is HardConcrete and type(p) is HardConcrete
    value = kl_divergence(q, p)
    assert value.shape == (2, 3)
    expected = reference([(qq, (0.5, 0.5, -0.2, 1.3)) for qq in qs])
    np.testing.assert_allclose(value.numpy(), np.broadcast_to(expected, (2, 3)), rtol=1e-9)


def test_kl_divergence_independent():
    qs = [(a, 2.0 / 3.0, -0.1, 1.1) for a in (-4.0, -1.0, 0.0, 1.5, 6.0)]
    ps = [(a, 0.5, -0.1, 1.1) for a in (0.0, 0.0, 1.0, -1.0, 2.0)]
    q, p = batched(qs), batched(ps)
    expected = reference(list(zip(qs, ps)))
    value = kl_divergence(q.to_event(1), p.to_event(1))
    assert value.shape == ()
    np.testing.assert_allclose(value.item(), expected.sum(), rtol=1e-9)
    torch_independent = kl_divergence(torch.distributions.Independent(q, 1), torch.distributions.Independent(p, 1))
    np.testing.assert_allclose(torch_independent.item(), expected.sum(), rtol=1e-9)
    # with a batch dimension left over
    value = kl_divergence(q.expand((2, 5)).to_event(1), p.to_event(1).expand((2,)))
    assert value.shape == (2,)
    np.testing.assert_allclose(value.numpy(), [expected.sum()] * 2, rtol=1e-9)


# ============================================================================ gradients
STRETCH_PAIRS = [((-0.1, 1.1), (-0.1, 1.1)), ((-0.1, 1.1), (-0.3, 1.4)), ((-0.3, 1.4), (-0.1, 1.1))]


@pytest.mark.parametrize("stretches", STRETCH_PAIRS)
def test_gradcheck_kl(stretches):
    (lq, uq), (lp, up) = stretches

    def kl(aq, bq, ap, bp):
        return kl_hard_concrete(HardConcrete(aq, bq, lq, uq), HardConcrete(ap, bp, lp, up))

    inputs = tuple(
        torch.tensor(v, dtype=torch.float64, requires_grad=True)
        for v in ([-2.0, 0.3, 3.0], [0.4, 2.0 / 3.0, 2.0], [0.5, -1.0, 1.0], [2.0 / 3.0, 0.3, 1.5])
    )
    assert torch.autograd.gradcheck(kl, inputs)


def test_kl_gradient_matches_reference_derivative(device):
    """d KL / d log_alpha_q and d KL / d temperature_p against central differences of the reference."""
    qp, pp = (1.0, 2.0 / 3.0, -0.1, 1.1), (-2.0, 0.3, -0.3, 1.4)
    aq = torch.tensor(qp[0], dtype=torch.float64, device=device, requires_grad=True)
    bp = torch.tensor(pp[1], dtype=torch.float64, device=device, requires_grad=True)
    value = kl_hard_concrete(
        HardConcrete(aq, *qp[1:]), HardConcrete(torch.tensor(pp[0], dtype=torch.float64, device=device), bp, *pp[2:])
    )
    g_aq, g_bp = torch.autograd.grad(value, (aq, bp))
    h = 1e-5
    d_aq = (ref.kl((qp[0] + h,) + qp[1:], pp)[0] - ref.kl((qp[0] - h,) + qp[1:], pp)[0]) / (2 * h)
    d_bp = (ref.kl(qp, (pp[0], pp[1] + h) + pp[2:])[0] - ref.kl(qp, (pp[0], pp[1] - h) + pp[2:])[0]) / (2 * h)
    np.testing.assert_allclose([g_aq.item(), g_bp.item()], [d_aq, d_bp], rtol=1e-6)


# ============================================================================ errors
def test_bad_method_raises():
    q, p = gate(PARAMS[0]), gate(PARAMS[1])
    with pytest.raises(ValueError, match="method"):
        kl_hard_concrete(q, p, method="exact")
    with pytest.raises(ValueError):
        kl_hard_concrete(q, p, method="monte_carlo", num_samples=0)


def test_non_hard_concrete_raises():
    q = gate(PARAMS[0])
    beta = Beta(torch.tensor(2.0, dtype=torch.float64), torch.tensor(3.0, dtype=torch.float64))
    with pytest.raises(TypeError):
        kl_hard_concrete(q, beta)
    with pytest.raises(TypeError):
        kl_hard_concrete(beta, q)
