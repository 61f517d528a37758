"""Tests of HardConcrete and StretchedConcrete against an independent reference.

Every expected value comes from ``hc_reference`` (mpmath / scipy.integrate.quad applied to the
paper's Eq. 23-26), never from ``l0bayes``.
"""

import itertools
import math

import hc_reference as ref
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from pyro.distributions.testing.gof import multinomial_goodness_of_fit
from scipy import integrate, stats

from l0bayes import HardConcrete, StretchedConcrete

LOG_ALPHAS = [-30.0, -5.0, -1.0, 0.0, 2.0, 8.0, 30.0]
TEMPERATURES = [0.05, 0.1, 2.0 / 3.0, 1.0, 3.0, 5.0]
STRETCHES = [(-0.1, 1.1), (-0.5, 1.2)]
GRID = [(a, b, l, u) for a, b, (l, u) in itertools.product(LOG_ALPHAS, TEMPERATURES, STRETCHES)]
INTERIOR = [1e-9, 1e-3, 0.05, 0.3, 0.5, 0.77, 0.999, 1.0 - 1e-9]


def batched(grid, dtype=torch.float64, validate_args=None, device="cpu"):
    """One HardConcrete whose batch runs over ``grid`` (a list of ``(a, b, l, u)``)."""
    cols = [torch.tensor(c, dtype=dtype, device=device) for c in zip(*grid)]
    return HardConcrete(*cols, validate_args=validate_args)


def single(a, b=2.0 / 3.0, l=-0.1, u=1.1, dtype=torch.float64, device="cpu", **kw):
    return HardConcrete(torch.tensor(a, dtype=dtype, device=device), b, l, u, **kw)


def column(fn, grid):
    return np.array([fn(*g) for g in grid])


def assert_float32_close(actual, expected, what=""):
    """Within 1e-5 relative or 1e-6 absolute of the float64 reference."""
    actual = np.asarray(actual.detach().double().cpu() if torch.is_tensor(actual) else actual, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    err = np.abs(actual - expected)
    ok = (err <= 1e-5 * np.abs(expected)) | (err <= 1e-6)
    assert ok.all(), f"{what}: worst {err[~ok]} at expected {expected[~ok]}, got {actual[~ok]}"


# ============================================================================ density, atoms
@pytest.mark.parametrize("lower, upper", STRETCHES)
def test_normalisation(lower, upper):
    """P0 + P1 + int_0^1 exp(log_prob) = 1 (atoms and density both from log_prob)."""
    grid = [(a, b, lower, upper) for a in LOG_ALPHAS for b in TEMPERATURES]
    d = batched(grid)
    n = len(grid)

    def density(x):
        return d.log_prob(torch.full((n,), x, dtype=torch.float64)).exp().numpy()

    interior, err = integrate.quad_vec(
        density, 0.0, 1.0, points=ref.split_points(*grid), epsabs=1e-14, epsrel=1e-13, norm="max"
    )
    assert err < 1e-11
    atoms = d.log_prob(torch.zeros(n, dtype=torch.float64)).exp() + d.log_prob(torch.ones(n, dtype=torch.float64)).exp()
    np.testing.assert_allclose(atoms.numpy() + interior, 1.0, rtol=0, atol=1e-8)
    # The continuous mass itself, where it is not negligible, against the reference density.
    mass = column(ref.interior_mass, grid)
    big = mass > 1e-6
    assert big.sum() > n // 2
    np.testing.assert_allclose(interior[big], mass[big], rtol=1e-8)


def test_log_prob_interior_matches_eq23(device):
    d = batched(GRID, device=device)
    z = torch.tensor(INTERIOR, dtype=torch.float64, device=device).unsqueeze(-1)
    actual = d.log_prob(z).cpu().numpy()
    expected = np.array([[ref.mp_log_prob(zi, *g) for g in GRID] for zi in INTERIOR])
    assert np.isfinite(expected).all()
    np.testing.assert_allclose(actual, expected, rtol=1e-10, atol=1e-12)


def test_log_prob_atoms_match_eq26(device):
    d = batched(GRID, device=device)
    n = len(GRID)
    log_p0 = d.log_prob(torch.zeros(n, dtype=torch.float64, device=device)).cpu().numpy()
    log_p1 = d.log_prob(torch.ones(n, dtype=torch.float64, device=device)).cpu().numpy()
    np.testing.assert_allclose(log_p0, column(lambda *g: ref.atoms(*g)["log_p0"], GRID), rtol=1e-10, atol=1e-300)
    np.testing.assert_allclose(log_p1, column(lambda *g: ref.atoms(*g)["log_p1"], GRID), rtol=1e-10, atol=1e-300)
    # and the properties, in probability space
    np.testing.assert_allclose(d.prob_zero.cpu().numpy(), column(lambda *g: ref.atoms(*g)["p0"], GRID), rtol=1e-12)
    np.testing.assert_allclose(d.prob_one.cpu().numpy(), column(lambda *g: ref.atoms(*g)["p1"], GRID), rtol=1e-12)
    pc = column(lambda *g: float(1 - sum(ref.mp_atoms(*g))), GRID)
    np.testing.assert_allclose(d.prob_continuous.cpu().numpy(), pc, rtol=1e-10)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_log_prob_outside_support_is_minus_inf(dtype):
    d = HardConcrete(torch.tensor([-3.0, 0.0, 4.0], dtype=dtype), 2.0 / 3.0, validate_args=False)
    outside = torch.tensor([-0.5, -1e-6, 1.0 + 1e-6, 1.5], dtype=dtype).unsqueeze(-1)
    lp = d.log_prob(outside)
    assert lp.shape == (4, 3)
    assert torch.all(lp == -math.inf)
    inside = d.log_prob(torch.tensor([0.0, 1e-6, 0.5, 1.0 - 1e-6, 1.0], dtype=dtype).unsqueeze(-1))
    assert torch.isfinite(inside).all()


# ============================================================================ cdf, icdf
def test_cdf_matches_integral_of_density():
    d = batched(GRID)
    zs = [0.01, 0.3, 0.5, 0.77, 0.99]
    actual = d.cdf(torch.tensor(zs, dtype=torch.float64).unsqueeze(-1)).numpy()
    expected = np.array([[ref.cdf_by_quad(z, *g) for g in GRID] for z in zs])
    np.testing.assert_allclose(actual, expected, rtol=1e-9, atol=1e-15)
    # and the closed form Eq. 24-25, evaluated in mpmath
    closed = np.array([[ref.mp_cdf(z, *g) for g in GRID] for z in zs])
    np.testing.assert_allclose(actual, closed, rtol=1e-12)


def test_cdf_special_points():
    d = batched(GRID)
    n = len(GRID)
    p0 = column(lambda *g: ref.atoms(*g)["p0"], GRID)
    p1 = column(lambda *g: ref.atoms(*g)["p1"], GRID)

    def cdf_at(x):
        return d.cdf(torch.full((n,), x, dtype=torch.float64)).numpy()

    assert (cdf_at(-0.1) == 0).all()
    assert (cdf_at(-1e-300) == 0).all()
    np.testing.assert_allclose(cdf_at(0.0), p0, rtol=1e-12)
    assert (cdf_at(1.0) == 1).all()
    assert (cdf_at(1.5) == 1).all()
    below_one = np.nextafter(1.0, 0.0)
    np.testing.assert_allclose(cdf_at(below_one), 1.0 - p1, rtol=0, atol=1e-15)
    np.testing.assert_allclose(cdf_at(below_one), column(lambda *g: ref.mp_cdf(below_one, *g), GRID), rtol=1e-12)


def test_icdf_inverts_cdf_in_the_interior():
    d = batched(GRID)
    z = torch.tensor(INTERIOR[1:-1], dtype=torch.float64).unsqueeze(-1).expand(-1, len(GRID))
    back = d.icdf(d.cdf(z)).numpy()
    z = z.numpy()
    # Keep the points where icdf is well conditioned: the rounding of p = cdf(z) alone moves z by
    # about eps * p / qbar(z); require that to be 100x below the tolerance.
    cond = np.array([[2.2e-16 * ref.mp_cdf(zi, *g) / (ref.qbar(zi, *g) * zi) for g in GRID] for zi in z[:, 0]])
    keep = cond < 1e-12
    assert keep.sum() > 0.5 * keep.size
    np.testing.assert_allclose(back[keep], z[keep], rtol=1e-10)


def test_icdf_atoms():
    d = batched(GRID)
    p0 = column(lambda *g: ref.atoms(*g)["p0"], GRID)
    p1 = column(lambda *g: ref.atoms(*g)["p1"], GRID)
    low = torch.tensor(np.stack([np.zeros_like(p0), 0.5 * p0, p0 * (1 - 1e-9)]))
    high = torch.tensor(np.stack([1.0 - 0.5 * p1, np.ones_like(p1)]))
    assert (d.icdf(low) == 0).all()
    assert (d.icdf(high) == 1).all()
    # just inside (P0, 1 - P1) the quantile is strictly inside (0, 1)
    mid = torch.tensor(p0 + 0.5 * (1 - p0 - p1))
    ok = (mid.numpy() > p0) & (mid.numpy() < 1 - p1)
    zm = d.icdf(mid).numpy()[ok]
    assert ok.sum() > 20 and ((zm > 0) & (zm < 1)).all()


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(
    a=st.floats(-8.0, 8.0),
    b=st.floats(0.1, 4.0),
    l=st.floats(-0.8, -0.02),
    u=st.floats(1.02, 1.8),
    p=st.floats(1e-6, 1.0 - 1e-6),
)
def test_icdf_is_generalised_inverse(a, b, l, u, p):
    """inf{z : F(z) >= p}: F(icdf(p)) >= p and F(z) < p just below icdf(p) (F from mpmath)."""
    z = single(a, b, l, u).icdf(torch.tensor(p, dtype=torch.float64)).item()
    assert 0.0 <= z <= 1.0
    assert ref.mp_cdf(z, a, b, l, u) >= p * (1 - 1e-11)
    # just below z the CDF is below p, wherever the rounding of p (about eps p / qbar(z) in z) is
    # small against the step 1e-8 z
    if 0 < z < 1 and 2.2e-16 * p / (ref.qbar(z, a, b, l, u) * z) < 1e-10:
        assert ref.mp_cdf(z * (1 - 1e-8), a, b, l, u) < p


# ============================================================================ Eq. 12, 13, median
def test_prob_nonzero_eq12():
    d = batched(GRID)
    expected = np.array(
        [
            float(ref.mp_sigmoid(mpmath_f(a) - mpmath_f(b) * ref.mpmath.log(-mpmath_f(l) / mpmath_f(u))))
            for a, b, l, u in GRID
        ]
    )
    np.testing.assert_allclose(d.prob_nonzero.numpy(), expected, rtol=1e-12)
    one_minus_cdf0 = 1.0 - d.cdf(torch.zeros(len(GRID), dtype=torch.float64)).numpy()
    np.testing.assert_allclose(d.prob_nonzero.numpy(), one_minus_cdf0, rtol=1e-12, atol=2e-16)


def mpmath_f(x):
    return ref.mpmath.mpf(float(x))


def test_deterministic_gate_eq13():
    d = batched(GRID)
    a, b, l, u = (np.array(c) for c in zip(*GRID))
    expected = np.clip(1.0 / (1.0 + np.exp(-a)) * (u - l) + l, 0.0, 1.0)
    np.testing.assert_allclose(d.deterministic_gate.numpy(), expected, rtol=1e-14, atol=0)
    assert d.deterministic_gate.shape == d.batch_shape


def test_median():
    d = batched(GRID)
    expected = []
    for a, b, l, u in GRID:
        at = ref.atoms(a, b, l, u)
        if at["p0"] >= 0.5:
            expected.append(0.0)
        elif at["p1"] >= 0.5:
            expected.append(1.0)
        else:  # solve Eq. 24-25 for Qbar(z) = 1/2: logit t(z) = a / b
            expected.append(
                float(mpmath_f(l) + (mpmath_f(u) - mpmath_f(l)) * ref.mp_sigmoid(mpmath_f(a) / mpmath_f(b)))
            )
    expected = np.array(expected)
    np.testing.assert_allclose(d.median.numpy(), expected, rtol=1e-12, atol=1e-15)
    assert 0.0 < expected.mean() < 1.0  # some medians are interior
    np.testing.assert_array_equal(d.median.numpy(), d.icdf(torch.full((len(GRID),), 0.5, dtype=torch.float64)).numpy())


# ============================================================================ moments, entropy
def test_mean_variance_float64():
    d = batched(GRID)
    mean, complement, variance = d.moments()
    expected = np.array([ref.moments(*g) for g in GRID])
    np.testing.assert_allclose(mean.numpy(), expected[:, 0], rtol=1e-9)
    np.testing.assert_allclose(complement.numpy(), expected[:, 1], rtol=1e-9)
    np.testing.assert_allclose(variance.numpy(), expected[:, 2], rtol=1e-9)
    np.testing.assert_allclose(d.mean.numpy(), expected[:, 0], rtol=1e-9)
    np.testing.assert_allclose(d.variance.numpy(), expected[:, 2], rtol=1e-9)


def test_entropy_float64():
    d = batched(GRID)
    expected = np.array([ref.entropy(*g) for g in GRID])
    err = np.abs(d.entropy().numpy() - expected[:, 0])
    # relative to the sum of |terms| (the entropy itself crosses zero inside the grid)
    assert (err <= 1e-9 * expected[:, 1]).all(), err / expected[:, 1]
    big = np.abs(expected[:, 0]) > 1e-3 * expected[:, 1]
    np.testing.assert_allclose(d.entropy().numpy()[big], expected[big, 0], rtol=1e-9)


def test_reference_quadrature_agrees_with_mpmath():
    """Guard for the reference itself: scipy quad of the float64 Eq. 23 vs mpmath.quad of the raw
    Eq. 23 at 30 digits, on the hardest corners (tiny continuous mass, sharp peak)."""
    mp = ref.mpmath
    with mp.workdps(30):
        for a, b, l, u in [(-30.0, 0.05, -0.1, 1.1), (2.0, 5.0, -0.5, 1.2), (30.0, 3.0, -0.1, 1.1)]:
            pts = [0.0] + ref.split_points((a, b, l, u)) + [1.0]
            mean_mp = mp.quad(lambda x: x * ref.mp_stretched_pdf(x, a, b, l, u), pts) + ref.mp_atoms(a, b, l, u)[1]
            assert abs(ref.moments(a, b, l, u)[0] / float(mean_mp) - 1) < 1e-12


# ============================================================================ float32
def test_float32_matches_float64_reference(device):
    d = batched(GRID, dtype=torch.float32, device=device)
    n = len(GRID)
    for x in [0.0, 1.0]:
        lp = d.log_prob(torch.full((n,), x, device=device))
        assert_float32_close(lp, [ref.mp_log_prob(x, *g) for g in GRID], f"log_prob({x})")
    zs = [0.01, 0.5, 0.99]
    for z in zs:
        lp = d.log_prob(torch.full((n,), z, device=device))
        assert_float32_close(lp, [ref.mp_log_prob(z, *g) for g in GRID], f"log_prob({z})")
        cdf = d.cdf(torch.full((n,), z, device=device))
        assert_float32_close(cdf, [ref.mp_cdf(z, *g) for g in GRID], f"cdf({z})")
    atoms = [ref.atoms(*g) for g in GRID]
    assert_float32_close(d.prob_zero, [t["p0"] for t in atoms], "prob_zero")
    assert_float32_close(d.prob_one, [t["p1"] for t in atoms], "prob_one")
    assert_float32_close(d.prob_nonzero, [1 - t["p0"] for t in atoms], "prob_nonzero")
    assert_float32_close(d.prob_continuous, [t["pc"] for t in atoms], "prob_continuous")
    moments = np.array([ref.moments(*g) for g in GRID])
    mean, complement, variance = d.moments()
    assert_float32_close(mean, moments[:, 0], "mean")
    assert_float32_close(complement, moments[:, 1], "1 - mean")
    assert_float32_close(variance, moments[:, 2], "variance")
    assert_float32_close(d.mean, moments[:, 0], "mean")
    assert_float32_close(d.variance, moments[:, 2], "variance")
    assert_float32_close(d.entropy(), [ref.entropy(*g)[0] for g in GRID], "entropy")
    for t in (mean, variance, d.entropy(), d.cdf(torch.full((n,), 0.5, device=device)), d.prob_nonzero):
        assert t.dtype == torch.float32 and t.device.type == torch.device(device).type


def test_float32_relative_accuracy_of_small_quantities(device):
    """Stronger than the 1e-6 absolute floor: the quantities that are ~1e-13 at |log_alpha| = 30
    (atoms, 1 - mean, variance, ...) keep their *relative* accuracy in float32 (no cancellation)."""
    d = batched(GRID, dtype=torch.float32, device=device)
    moments = np.array([ref.moments(*g) for g in GRID])
    atoms = [ref.atoms(*g) for g in GRID]

    def rel(actual, expected):
        expected = np.asarray(expected)
        return np.abs(actual.double().cpu().numpy() - expected) / np.abs(expected)

    mean, complement, variance = d.moments()
    for name, actual, expected in [
        ("mean", mean, moments[:, 0]),
        ("1 - mean", complement, moments[:, 1]),
        ("variance", variance, moments[:, 2]),
    ]:
        assert rel(actual, expected).max() < 1e-5, name
    for name, actual, key in [
        ("prob_zero", d.prob_zero, "p0"),
        ("prob_one", d.prob_one, "p1"),
        ("prob_continuous", d.prob_continuous, "pc"),
    ]:
        assert rel(actual, [t[key] for t in atoms]).max() < 2e-5, name
    entropy = np.array([ref.entropy(*g) for g in GRID])
    assert (np.abs(d.entropy().double().cpu().numpy() - entropy[:, 0]) < 1e-5 * entropy[:, 1]).all()


@pytest.mark.parametrize("a", [-30.0, 30.0])
@pytest.mark.parametrize("b", [0.05, 5.0])
@pytest.mark.parametrize("stretch", STRETCHES)
def test_float32_values_and_gradients_finite(a, b, stretch):
    torch.manual_seed(0)
    quantities = {
        "log_prob(0)": lambda d: d.log_prob(torch.zeros(())),
        "log_prob(0.5)": lambda d: d.log_prob(torch.full((), 0.5)),
        "log_prob(1e-4)": lambda d: d.log_prob(torch.full((), 1e-4)),
        "log_prob(1)": lambda d: d.log_prob(torch.ones(())),
        "cdf(0.5)": lambda d: d.cdf(torch.full((), 0.5)),
        "prob_nonzero": lambda d: d.prob_nonzero,
        "prob_continuous": lambda d: d.prob_continuous,
        "mean": lambda d: d.mean,
        "variance": lambda d: d.variance,
        "entropy": lambda d: d.entropy(),
        "rsample": lambda d: d.rsample((1000,)).sum(),
        "sample_continuous": lambda d: d.sample_continuous((1000,)).sum(),
    }
    for name, fn in quantities.items():
        params = [torch.tensor(x, dtype=torch.float32, requires_grad=True) for x in (a, b, *stretch)]
        value = fn(HardConcrete(*params))
        assert torch.isfinite(value).all(), name
        grads = torch.autograd.grad(value, params, allow_unused=True)
        for pname, g in zip(("log_alpha", "temperature", "lower", "upper"), grads):
            assert g is None or torch.isfinite(g).all(), f"{name}: d/d{pname} = {g}"
        if name not in ("rsample",):  # rsample is 0 or 1 almost surely here (no gradient path)
            assert grads[0] is not None, name


# ============================================================================ sampling
GOF_CASES = [(0.0, 2.0 / 3.0, -0.1, 1.1), (1.5, 0.5, -0.5, 1.2), (-1.0, 3.0, -0.1, 1.1)]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("case", GOF_CASES)
def test_rsample_goodness_of_fit(case, dtype, device):
    torch.manual_seed(1)
    d = single(*case, dtype=dtype, device=device)
    z = d.rsample((40000,))
    assert z.dtype == dtype and z.shape == (40000,) and z.device.type == torch.device(device).type
    z = z.cpu()
    assert ((z >= 0) & (z <= 1)).all()
    inside = (z > 0) & (z < 1)
    counts = torch.stack([(z == 0).sum(), inside.sum(), (z == 1).sum()]).double()
    at = ref.atoms(*case)
    probs = torch.tensor([at["p0"], at["pc"], at["p1"]], dtype=torch.float64)
    assert multinomial_goodness_of_fit(probs, counts) > 1e-3
    interior = z[inside].double().numpy()
    assert stats.kstest(interior, ref.truncated_cdf(*case)).pvalue > 1e-3
    # sample() draws from the same law
    s = d.sample((40000,)).cpu()
    assert not s.requires_grad
    counts = torch.stack([(s == 0).sum(), ((s > 0) & (s < 1)).sum(), (s == 1).sum()]).double()
    assert multinomial_goodness_of_fit(probs, counts) > 1e-3


SAMPLE_CONTINUOUS_CASES = [
    (0.0, 2.0 / 3.0, -0.1, 1.1),
    (3.0, 5.0, -0.5, 1.2),
    (-12.0, 0.2, -0.1, 1.1),  # upper tail: Qbar(0), Qbar(1) both 1 - 1e-5
    (12.0, 0.2, -0.1, 1.1),
    (-16.0, 0.2, -0.1, 1.1),  # float32: 1 - Qbar ~ 2e-7, naive inversion has ~3 levels
    (-36.0, 0.1, -0.5, 1.2),  # float64: 1 - Qbar ~ 1e-16
    (36.0, 0.1, -0.5, 1.2),
]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("case", SAMPLE_CONTINUOUS_CASES)
def test_sample_continuous_ks(case, dtype, device):
    """The continuous part, truncated to (0, 1) (Eq. 29 corrected), including far tails.

    The sampler maps one uniform per draw monotonically, so the statistic is that of torch's uniform stream:
    10^6 draws, since the first 20,000 float64 uniforms of seed 2 on CUDA alone have KS p = 0.0007
    (``benchmarks/gpu/ks_cuda.py``)."""
    n = 1_000_000
    torch.manual_seed(2)
    d = single(*case, dtype=dtype, device=device)
    z = d.sample_continuous((n,))
    assert z.dtype == dtype and z.shape == (n,) and z.device.type == torch.device(device).type
    z = z.cpu()
    assert ((z >= 0) & (z <= 1)).all()
    assert ((z == 0) | (z == 1)).double().mean() < 1e-3
    assert stats.kstest(z.double().numpy(), ref.truncated_cdf(*case)).pvalue > 1e-3


def test_sample_continuous_is_reparameterised():
    """d/da E[z | 0 < z < 1] by the pathwise gradient of sample_continuous vs a finite difference of
    the reference truncated mean."""
    torch.manual_seed(3)
    a0, b, l, u = 0.5, 2.0 / 3.0, -0.1, 1.1
    n = 100000
    a = torch.full((n,), a0, dtype=torch.float64, requires_grad=True)
    z = HardConcrete(a, b, l, u).sample_continuous()
    (g,) = torch.autograd.grad(z.sum(), a)

    def truncated_mean(x):
        at = ref.atoms(x, b, l, u)
        return (ref.moments(x, b, l, u)[0] - at["p1"]) / at["pc"]

    h = 1e-4
    expected = (truncated_mean(a0 + h) - truncated_mean(a0 - h)) / (2 * h)
    se = g.std().item() / math.sqrt(n)
    assert abs(g.mean().item() - expected) < 4 * se, (g.mean().item(), expected, se)
    assert abs(expected) > 10 * se  # the test has power


def test_rsample_pathwise_gradient_matches_mean_derivative(device):
    """Average of d z / d(log_alpha, temperature) over rsample vs derivative of the reference mean."""
    torch.manual_seed(5)
    a0, b0, l, u = -0.5, 0.8, -0.5, 1.2
    n = 200000
    a = torch.full((n,), a0, dtype=torch.float64, device=device, requires_grad=True)
    b = torch.full((n,), b0, dtype=torch.float64, device=device, requires_grad=True)
    z = HardConcrete(a, b, l, u).rsample()
    ga, gb = torch.autograd.grad(z.sum(), (a, b))
    h = 1e-4
    da = (ref.moments(a0 + h, b0, l, u)[0] - ref.moments(a0 - h, b0, l, u)[0]) / (2 * h)
    db = (ref.moments(a0, b0 + h, l, u)[0] - ref.moments(a0, b0 - h, l, u)[0]) / (2 * h)
    for g, expected in ((ga, da), (gb, db)):
        se = g.std().item() / math.sqrt(n)
        assert abs(g.mean().item() - expected) < 4 * se, (g.mean().item(), expected, se)


# ============================================================================ shapes, dtypes
def test_batch_shapes_and_broadcasting():
    d = HardConcrete(torch.zeros(3, 1), torch.tensor([0.5, 1.0, 2.0, 3.0]))
    assert d.batch_shape == (3, 4)
    assert d.event_shape == ()
    assert d.rsample((5,)).shape == (5, 3, 4)
    assert d.sample((2, 5)).shape == (2, 5, 3, 4)
    assert d.sample_continuous((5,)).shape == (5, 3, 4)
    assert d.rsample().shape == (3, 4)
    assert d.log_prob(torch.full((7, 1, 1), 0.5)).shape == (7, 3, 4)
    assert d.log_prob(torch.tensor(0.5)).shape == (3, 4)
    assert d.cdf(torch.tensor(0.5)).shape == (3, 4)
    assert d.icdf(torch.tensor(0.5)).shape == (3, 4)
    for t in (
        d.mean,
        d.variance,
        d.entropy(),
        d.prob_zero,
        d.prob_one,
        d.prob_nonzero,
        d.prob_continuous,
        d.deterministic_gate,
        d.median,
        *d.moments(),
    ):
        assert t.shape == (3, 4)
    # the batch elements along the broadcast dims are the right ones
    np.testing.assert_allclose(
        d.prob_nonzero[0].double().numpy(),
        [ref.atoms(0.0, t, -0.1, 1.1)["pc"] + ref.atoms(0.0, t, -0.1, 1.1)["p1"] for t in (0.5, 1.0, 2.0, 3.0)],
        rtol=1e-6,
    )
    scalar = HardConcrete(0.3, 0.5, -0.2, 1.3)
    assert scalar.batch_shape == ()
    assert scalar.rsample((4,)).shape == (4,)
    assert scalar.mean.shape == ()
    lower_batched = HardConcrete(0.0, 2.0 / 3.0, torch.tensor([-0.1, -0.2]))
    assert lower_batched.batch_shape == (2,)


def test_expand():
    grid = [(-1.0, 0.5, -0.1, 1.1), (0.0, 2.0 / 3.0, -0.2, 1.3), (2.0, 3.0, -0.5, 1.2)]
    d = batched(grid)
    e = d.expand((2, 3))
    assert type(e) is HardConcrete
    assert e.batch_shape == (2, 3)
    expected_mean = np.array([ref.moments(*g)[0] for g in grid])
    np.testing.assert_allclose(e.mean.numpy(), np.broadcast_to(expected_mean, (2, 3)), rtol=1e-9)
    np.testing.assert_allclose(
        e.log_prob(torch.full((2, 3), 0.4, dtype=torch.float64)).numpy(),
        np.broadcast_to([ref.mp_log_prob(0.4, *g) for g in grid], (2, 3)),
        rtol=1e-10,
    )
    assert e.rsample((4,)).shape == (4, 2, 3)
    assert type(HardConcrete(0.0).expand((5,))) is HardConcrete
    assert type(d.base) is StretchedConcrete and d.base.batch_shape == (3,)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_dtype_is_preserved(dtype):
    d = HardConcrete(torch.tensor([-1.0, 0.0, 2.0], dtype=dtype), 2.0 / 3.0)
    outputs = [
        d.log_prob(torch.tensor(0.5, dtype=torch.float64)),
        d.log_prob(torch.tensor(0.0)),
        d.cdf(torch.tensor(0.3)),
        d.icdf(torch.tensor(0.3)),
        d.rsample((2,)),
        d.sample((2,)),
        d.sample_continuous((2,)),
        d.mean,
        d.variance,
        d.entropy(),
        d.prob_zero,
        d.prob_one,
        d.prob_nonzero,
        d.prob_continuous,
        d.deterministic_gate,
        d.median,
        *d.moments(),
        d.base.rsample(),
        d.base.log_prob(torch.tensor(0.5, dtype=dtype)),
    ]
    for t in outputs:
        assert t.dtype == dtype


# ============================================================================ validation
@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(temperature=0.0), "temperature"),
        (dict(temperature=-1.0), "temperature"),
        (dict(lower=0.0), "lower"),
        (dict(lower=0.2), "lower"),
        (dict(upper=1.0), "upper"),
        (dict(upper=0.5), "upper"),
        # infinite values used to pass validation, then gave NaN or a ZeroDivisionError in the quadrature
        (dict(temperature=math.inf), "temperature"),
        (dict(temperature=math.nan), "temperature"),
        (dict(lower=-math.inf), "lower"),
        (dict(upper=math.inf), "upper"),
        (dict(log_alpha=torch.tensor([0.0, math.nan])), "log_alpha"),
    ],
)
@pytest.mark.parametrize("cls", [HardConcrete, StretchedConcrete])
def test_validate_args_parameters(kwargs, name, cls):
    kwargs = {"log_alpha": torch.zeros(2), **kwargs}
    with pytest.raises(ValueError, match=f"parameter {name} "):
        cls(validate_args=True, **kwargs)
    cls(validate_args=False, **kwargs)  # not checked when disabled, the torch.distributions way


@pytest.mark.parametrize("cls", [HardConcrete, StretchedConcrete])
def test_integer_parameters_are_a_type_error_naming_them(cls):
    # an integer log_alpha used to turn the float defaults into integers and blame temperature
    with pytest.raises(TypeError, match="log_alpha must be a floating-point"):
        cls(torch.tensor([1, 2]))
    with pytest.raises(TypeError, match="temperature must be a floating-point"):
        cls(torch.zeros(2), temperature=torch.tensor(1))
    assert cls(torch.zeros(2), temperature=1, lower=-1, upper=2).temperature.dtype == torch.float32


@pytest.mark.parametrize("cls", [HardConcrete, StretchedConcrete])
def test_cdf_icdf_nan(cls):
    nan = torch.tensor([math.nan, 0.5])
    checked = cls(torch.zeros(2), validate_args=True)
    with pytest.raises(ValueError, match="cdf: value must not be NaN"):
        checked.cdf(nan)
    with pytest.raises(ValueError, match="icdf: value must be a probability"):
        checked.icdf(nan)
    unchecked = cls(torch.zeros(2), validate_args=False)
    assert torch.isnan(unchecked.cdf(nan)[0]) and not torch.isnan(unchecked.cdf(nan)[1])  # cdf(nan) was 0
    assert torch.isnan(unchecked.icdf(nan)[0])
    # cdf is defined on the whole line: values outside the support are fine, checked or not
    assert checked.cdf(torch.tensor([-5.0, 5.0])).tolist() == [0.0, 1.0]


@pytest.mark.parametrize("value", [-0.5, -1e-3, 1.001, 1.5])
def test_validate_args_log_prob_outside_support(value):
    d = HardConcrete(torch.zeros(2), validate_args=True)
    with pytest.raises(ValueError, match="value"):
        d.log_prob(torch.tensor(value))
    d.log_prob(torch.tensor([0.0, 0.5, 1.0]).unsqueeze(-1))  # inside: fine


def test_support_and_constraints():
    d = HardConcrete(torch.zeros(2))
    assert d.support.check(torch.tensor([0.0, 0.5, 1.0])).all()
    assert not d.support.check(torch.tensor([-0.1, 1.1])).any()
    assert set(d.arg_constraints) == {"log_alpha", "temperature", "lower", "upper"}
    assert d.has_rsample


# ============================================================================ gradients
def _inputs(*values):
    return tuple(torch.tensor(v, dtype=torch.float64, requires_grad=True) for v in values)


GRAD_A = [-3.0, 0.4, 2.5]
GRAD_B = [0.3, 2.0 / 3.0, 2.5]


@pytest.mark.parametrize(
    "name, fn",
    [
        ("log_prob(interior)", lambda d: d.log_prob(torch.tensor([[0.05], [0.4], [0.93]], dtype=torch.float64))),
        ("log_prob(0)", lambda d: d.log_prob(torch.zeros((), dtype=torch.float64))),
        ("log_prob(1)", lambda d: d.log_prob(torch.ones((), dtype=torch.float64))),
        ("cdf", lambda d: d.cdf(torch.tensor([[0.0], [0.3], [0.8]], dtype=torch.float64))),
        ("prob_nonzero", lambda d: d.prob_nonzero),
        ("mean", lambda d: d.mean),
        ("variance", lambda d: d.variance),
        ("entropy", lambda d: d.entropy()),
    ],
)
def test_gradcheck_log_alpha_temperature(name, fn):
    a, b = _inputs(GRAD_A, GRAD_B)
    assert torch.autograd.gradcheck(lambda a, b: fn(HardConcrete(a, b, -0.2, 1.15)), (a, b))


def test_gradcheck_log_prob_stretch():
    a, b, l, u = _inputs(GRAD_A, GRAD_B, [-0.1, -0.3, -0.05], [1.1, 1.4, 1.02])
    z = torch.tensor([[0.05], [0.4], [0.93]], dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda *p: HardConcrete(*p).log_prob(z), (a, b, l, u))
    assert torch.autograd.gradcheck(lambda *p: HardConcrete(*p).log_prob(torch.zeros(())), (a, b, l, u))
    assert torch.autograd.gradcheck(lambda *p: HardConcrete(*p).mean, (a, b, l, u))


# ============================================================================ StretchedConcrete
STRETCHED_CASES = [(-2.0, 1.0, -0.1, 1.1), (0.5, 2.0 / 3.0, -0.5, 1.2), (1.0, 3.0, -0.3, 1.4), (1.0, 0.5, -0.1, 1.1)]


@pytest.mark.parametrize("case", STRETCHED_CASES)
def test_stretched_concrete_density_and_cdf(case):
    a, b, l, u = case
    d = StretchedConcrete(torch.tensor(a, dtype=torch.float64), b, l, u)
    assert d.batch_shape == () and d.support.lower_bound == l and d.support.upper_bound == u

    def density(x):
        return d.log_prob(torch.tensor(x, dtype=torch.float64)).exp().item()

    # Near the ends Eq. 23 behaves like (x - l)^(b - 1) and (u - x)^(b - 1): integrate with that
    # algebraic weight (QAWS), so that the singularity of b < 1 is handled exactly. QAWS evaluates
    # the end points too, where (x - l) = 1 ulp stands in for the limit.
    e = b - 1.0
    inner_l, inner_u = np.nextafter(l, u), np.nextafter(u, l)

    def weighted_density(x):
        x = min(max(x, inner_l), inner_u)
        return density(x) / ((x - l) ** e * (u - x) ** e)

    total = integrate.quad(weighted_density, l, u, weight="alg", wvar=(e, e), epsabs=1e-13, epsrel=1e-12, limit=200)[0]
    assert abs(total - 1.0) < 1e-8
    xs = [l + 1e-6, l / 2, 0.0, 0.3, 0.9, u - 1e-6]
    x = torch.tensor(xs, dtype=torch.float64)
    np.testing.assert_allclose(
        d.log_prob(x).numpy(),
        [float(ref.mpmath.log(ref.mp_stretched_pdf(t, *case))) for t in xs],
        rtol=1e-10,
        atol=1e-12,
    )

    expected = [ref.mp_stretched_cdf_by_quad(t, *case) for t in xs]
    np.testing.assert_allclose(d.cdf(x).numpy(), expected, rtol=1e-9, atol=0)
    np.testing.assert_allclose(d.cdf(x).numpy(), [float(ref.mp_stretched_cdf(t, *case)) for t in xs], rtol=1e-12)
    np.testing.assert_allclose(d.icdf(d.cdf(x[1:-1])).numpy(), xs[1:-1], rtol=1e-10, atol=1e-14)
    out = StretchedConcrete(torch.tensor(a, dtype=torch.float64), b, l, u, validate_args=False)
    assert (out.log_prob(torch.tensor([l - 0.1, u + 0.1], dtype=torch.float64)) == -math.inf).all()
    assert (out.cdf(torch.tensor([l - 0.1, u + 0.1], dtype=torch.float64)).numpy() == [0.0, 1.0]).all()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("case", STRETCHED_CASES)
def test_stretched_concrete_rsample_ks(case, dtype, device):
    torch.manual_seed(6)
    d = StretchedConcrete(torch.tensor(case[0], dtype=dtype, device=device), *case[1:])
    x = d.rsample((20000,))
    assert x.dtype == dtype and x.shape == (20000,) and x.device.type == torch.device(device).type
    x = x.cpu()
    assert ((x >= case[2]) & (x <= case[3])).all()
    assert stats.kstest(x.double().numpy(), ref.stretched_cdf_np(*case)).pvalue > 1e-3
