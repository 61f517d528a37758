"""Property-based probes of every public distribution method over the ways a user can call it.

Each probe draws parameters in one of four *forms*: Python floats, 0-dim tensors, a batch (1-d
tensors) and broadcasting shapes (``log_alpha`` of shape ``(k, 1)`` against a temperature of shape
``(m,)``), in float32 or float64, with ``validate_args`` on or off, and values that include the atoms
0 and 1, points outside the support, and NaN. Every result is checked against a reference computed
another way:

* *elementwise*: the same method on one-element batches, one parameter set at a time, so that the
  scalar, 0-dim and broadcast code paths are checked against the plain batched one;
* *independent*: ``hc_reference`` (mpmath at 50 digits, SciPy quadrature) for log densities,
  atoms, CDFs, moments, entropy and the KL;
* *limits*: the exact values at ``log_alpha = +-inf`` (a point mass at 1 or 0).

The default run draws :data:`DEFAULT_EXAMPLES` cases per probe (well under a minute in all);
``pytest -m slow`` runs the same probes with :data:`SLOW_EXAMPLES` each.
"""

import math

import hc_reference as ref
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy import stats

from l0bayes import HardConcrete, StretchedConcrete, kl_hard_concrete

DEFAULT_EXAMPLES = 25
SLOW_EXAMPLES = 400
FORMS = ("float", "0dim", "batch", "broadcast")
DTYPES = (torch.float32, torch.float64)
#: (rtol, atol) between two evaluations of the same formula in one dtype (different code paths).
SAME_DTYPE_TOL = {torch.float32: (2e-5, 1e-6), torch.float64: (1e-12, 1e-14)}
#: The same for quadrature (mean, variance, entropy): a batch takes as many nodes as its hardest
#: gate, so its values differ from a lone gate's within the quadrature's accuracy (1e-10 / 1e-6).
QUADRATURE_TOL = {torch.float32: (2e-5, 2e-6), torch.float64: (1e-9, 1e-11)}


def _probe(strategy, examples=DEFAULT_EXAMPLES, slow_examples=SLOW_EXAMPLES):
    """Turn ``check(case)`` into two tests: a short default probe and a long ``slow`` one."""

    def wrap(check):
        common = dict(deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])

        @settings(max_examples=examples, derandomize=True, **common)
        @given(case=strategy)
        def default(case):
            check(case)

        @pytest.mark.slow
        @settings(max_examples=slow_examples, **common)
        @given(case=strategy)
        def long(case):
            check(case)

        default.__doc__ = long.__doc__ = check.__doc__
        return default, long

    return wrap


# ---------------------------------------------------------------------------------------- strategies
finite_log_alpha = st.floats(-25.0, 25.0, allow_nan=False)
any_log_alpha = st.one_of(finite_log_alpha, st.sampled_from([math.inf, -math.inf]))
temperatures = st.floats(0.1, 3.0)
lowers = st.floats(-0.6, -0.02)
uppers = st.floats(1.02, 1.6)
#: Gate values: the two atoms, the interior, outside the support.
gate_values = st.one_of(
    st.sampled_from([0.0, 1.0]),
    st.floats(1e-6, 1.0 - 1e-6),
    st.sampled_from([-0.25, 1.25, -1e-7, 1.0 + 1e-6]),
)


@st.composite
def parameter_sets(draw, log_alphas=finite_log_alpha, size=None):
    """``(form, dtype, validate, params)`` with ``params`` a list of ``(a, b, l, u)`` tuples laid out per form."""
    form = draw(st.sampled_from(FORMS))
    dtype = torch.float32 if form == "float" else draw(st.sampled_from(DTYPES))
    validate = draw(st.booleans())
    if form in ("float", "0dim"):
        shape = ()
    elif form == "batch":
        shape = (size or draw(st.integers(1, 4)),)
    else:
        shape = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    n = math.prod(shape)
    a = [draw(log_alphas) for _ in range(shape[0] if form == "broadcast" else n)]
    b = [draw(temperatures) for _ in range(shape[1] if form == "broadcast" else n)]
    # one stretch per case: broadcasting a scalar stretch is the common use
    l, u = draw(lowers), draw(uppers)
    return dict(form=form, dtype=dtype, validate=validate, shape=shape, a=a, b=b, l=l, u=u)


def build(case, cls=HardConcrete):
    """The distribution of ``case`` in its form."""
    form, dtype, validate = case["form"], case["dtype"], case["validate"]
    a, b, l, u = case["a"], case["b"], case["l"], case["u"]
    if form == "float":
        return cls(a[0], b[0], l, u, validate_args=validate)
    if form == "0dim":
        t = [torch.tensor(x, dtype=dtype) for x in (a[0], b[0], l, u)]
        return cls(*t, validate_args=validate)
    if form == "batch":
        return cls(torch.tensor(a, dtype=dtype), torch.tensor(b, dtype=dtype), l, u, validate_args=validate)
    return cls(
        torch.tensor(a, dtype=dtype).unsqueeze(-1),
        torch.tensor(b, dtype=dtype),
        torch.tensor(l, dtype=dtype),
        u,
        validate_args=validate,
    )


def grid(case):
    """The parameter tuple of each batch element, in row-major order of the batch shape."""
    if case["form"] == "broadcast":
        return [(a, b, case["l"], case["u"]) for a in case["a"] for b in case["b"]]
    return [(a, b, case["l"], case["u"]) for a, b in zip(case["a"], case["b"])]


def one(params, dtype, cls=HardConcrete):
    """A one-element batch, the plain code path: the elementwise reference."""
    return cls(*(torch.tensor([x], dtype=dtype) for x in params), validate_args=False)


def elementwise(case, method, values=None, cls=HardConcrete):
    """``method(dist, value)`` evaluated one batch element at a time, reshaped to the batch shape."""
    out = []
    for i, params in enumerate(grid(case)):
        d = one(params, case["dtype"], cls)
        v = None if values is None else values.reshape(-1)[i].reshape(1)
        out.append(method(d, v).reshape(()))
    return torch.stack(out).reshape(case["shape"])


def assert_same(actual, expected, dtype, what, tolerances=SAME_DTYPE_TOL):
    """Equal within the dtype's tolerance, infinities and NaN in the same places."""
    rtol, atol = tolerances[dtype]
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    torch.testing.assert_close(actual.double(), expected.double(), rtol=rtol, atol=atol, equal_nan=True, msg=what)


def batch_values(case, draw_values):
    """A value tensor of the case's batch shape (dtype of the case)."""
    return torch.tensor(draw_values, dtype=case["dtype"]).reshape(case["shape"])


@st.composite
def cases_with_values(draw, log_alphas=finite_log_alpha, values=gate_values):
    case = draw(parameter_sets(log_alphas))
    n = math.prod(case["shape"])
    case["values"] = [draw(values) for _ in range(n)]
    return case


# ---------------------------------------------------------------------------------------- log_prob
@_probe(cases_with_values(any_log_alpha))
def _log_prob(case):
    """log_prob in every form equals the one-element evaluation and mpmath's Eq. 26, atoms included."""
    d = build(case)
    z = batch_values(case, case["values"])
    inside = ((z >= 0) & (z <= 1)).all()
    if case["validate"] and not inside:
        with pytest.raises(ValueError):
            d.log_prob(z)
        return
    got = d.log_prob(z)
    assert got.dtype == case["dtype"]
    assert_same(got, elementwise(case, lambda e, v: e.log_prob(v), z), case["dtype"], "log_prob vs elementwise")
    if case["dtype"] == torch.float64:
        for (a, b, l, u), zi, gi in zip(grid(case), z.reshape(-1).tolist(), got.reshape(-1).tolist()):
            if math.isinf(a):  # point mass: 0 at its atom, -inf elsewhere
                expected = 0.0 if zi == (1.0 if a > 0 else 0.0) else -math.inf
            else:
                expected = ref.mp_log_prob(zi, a, b, l, u)
            assert gi == pytest.approx(expected, rel=1e-9, abs=1e-12), (a, b, l, u, zi)


test_log_prob_forms, test_log_prob_forms_long = _log_prob


@_probe(parameter_sets(any_log_alpha))
def _log_prob_nan(case):
    """NaN is rejected with validate_args and propagates as NaN without it (never -inf)."""
    d = build(case)
    z = torch.full(case["shape"], math.nan, dtype=case["dtype"])
    if case["validate"]:
        with pytest.raises(ValueError):
            d.log_prob(z)
        return
    assert torch.isnan(d.log_prob(z)).all()
    base = build(case, StretchedConcrete)
    assert torch.isnan(base.log_prob(z)).all()


test_log_prob_nan, test_log_prob_nan_long = _log_prob_nan


@_probe(cases_with_values(finite_log_alpha, st.sampled_from([0.0, 1.0, 0.5])))
def _log_prob_scalar_value(case):
    """A scalar value against any batch broadcasts to the batch shape with the batch's values."""
    d = build(case)
    z = torch.tensor(case["values"][0], dtype=case["dtype"])
    got = d.log_prob(z)
    assert got.shape == d.batch_shape
    expected = elementwise(case, lambda e, v: e.log_prob(z.reshape(1)))
    assert_same(got, expected.reshape(d.batch_shape), case["dtype"], "log_prob(scalar)")


test_log_prob_scalar_value, test_log_prob_scalar_value_long = _log_prob_scalar_value


# ---------------------------------------------------------------------------------------- cdf, icdf
@_probe(cases_with_values(any_log_alpha))
def _cdf(case):
    """cdf in every form equals the one-element evaluation and mpmath's Eq. 24-26."""
    d = build(case)
    z = batch_values(case, case["values"])
    got = d.cdf(z)
    assert_same(got, elementwise(case, lambda e, v: e.cdf(v), z), case["dtype"], "cdf vs elementwise")
    if case["dtype"] == torch.float64:
        for (a, b, l, u), zi, gi in zip(grid(case), z.reshape(-1).tolist(), got.reshape(-1).tolist()):
            if math.isinf(a):
                expected = float(zi >= 1.0) if a > 0 else float(zi >= 0.0)
            else:
                expected = ref.mp_cdf(zi, a, b, l, u)
            assert gi == pytest.approx(expected, rel=1e-10, abs=1e-15), (a, b, l, u, zi)


test_cdf_forms, test_cdf_forms_long = _cdf


@_probe(cases_with_values(any_log_alpha, st.one_of(st.floats(0.0, 1.0), st.sampled_from([-0.1, 1.1]))))
def _icdf(case):
    """icdf in every form equals the one-element evaluation; it is the generalised inverse of cdf."""
    d = build(case)
    p = batch_values(case, case["values"])
    if not ((p >= 0) & (p <= 1)).all():
        if case["validate"]:
            with pytest.raises(ValueError):
                d.icdf(p)
        return
    got = d.icdf(p)
    assert ((got >= 0) & (got <= 1)).all()
    assert_same(got, elementwise(case, lambda e, v: e.icdf(v), p), case["dtype"], "icdf vs elementwise")
    if case["dtype"] == torch.float64:
        for (a, b, l, u), pi, zi in zip(grid(case), p.reshape(-1).tolist(), got.reshape(-1).tolist()):
            if not math.isinf(a):  # F(icdf(p)) >= p
                assert ref.mp_cdf(zi, a, b, l, u) >= pi * (1 - 1e-9), (a, b, l, u, pi)


test_icdf_forms, test_icdf_forms_long = _icdf


# ---------------------------------------------------------------------------------------- sampling
@_probe(parameter_sets(any_log_alpha))
def _samplers(case):
    """rsample, sample and sample_continuous: shape, dtype, support; rsample carries a gradient."""
    d = build(case)
    for method in ("rsample", "sample", "sample_continuous"):
        z = getattr(d, method)((5,))
        assert z.shape == (5,) + tuple(d.batch_shape), method
        assert z.dtype == case["dtype"]
        assert ((z >= 0) & (z <= 1)).all(), method
    for i, (a, *_) in enumerate(grid(case)):
        z = d.sample((200,)).reshape(200, -1)[:, i]
        if math.isinf(a):  # a point mass
            assert (z == (1.0 if a > 0 else 0.0)).all()
    log_alpha = torch.tensor(case["a"], dtype=case["dtype"]).requires_grad_()
    e = HardConcrete(log_alpha, validate_args=case["validate"])
    e.rsample((3,)).sum().backward()
    assert log_alpha.grad is not None and torch.isfinite(log_alpha.grad).all()


test_samplers, test_samplers_long = _samplers


@_probe(parameter_sets(st.sampled_from([math.inf, -math.inf])), examples=10, slow_examples=100)
def _sample_continuous_limit(case):
    """At log_alpha = +-inf, sample_continuous draws the limit law (Kolmogorov-Smirnov).

    As log_alpha -> +inf the continuous part's conditional density in the logit variable ``v`` on
    ``(v0, v1)`` tends to one proportional to ``exp(temperature v)`` (the logistic density's tail),
    and to ``exp(-temperature v)`` as log_alpha -> -inf.
    """
    d = build(case)
    torch.manual_seed(0)
    z = d.sample_continuous((400,)).reshape(400, -1)[:, 0].double().numpy()
    a, b, l, u = grid(case)[0]
    v0, v1 = math.log(-l) - math.log(u), math.log1p(-l) - math.log(u - 1.0)
    v = np.log(z - l) - np.log(u - z)
    rate = b if a > 0 else -b
    # CDF of the tilted law: expm1(rate (v - v0)) / expm1(rate (v1 - v0))
    cdf = lambda x: np.expm1(rate * (np.clip(x, v0, v1) - v0)) / math.expm1(rate * (v1 - v0))  # noqa: E731
    assert stats.kstest(v, cdf).pvalue > 1e-4


test_sample_continuous_limit, test_sample_continuous_limit_long = _sample_continuous_limit


# ---------------------------------------------------------------------------------------- expectations
@_probe(parameter_sets(any_log_alpha))
def _expectations(case):
    """Atoms, Eq. 12, Eq. 13, mean, variance, moments, entropy and median in every form.

    Each equals the one-element evaluation; in float64 the atoms and entropy match the reference,
    and at log_alpha = +-inf every quantity takes the value of the point mass (entropy 0).
    """
    d = build(case)
    dtype = case["dtype"]
    names = ["prob_zero", "prob_one", "prob_nonzero", "prob_continuous", "deterministic_gate", "median"]
    for name in names + ["mean", "variance"]:
        got = getattr(d, name)
        assert got.shape == d.batch_shape, name
        tolerances = SAME_DTYPE_TOL if name in names else QUADRATURE_TOL
        assert_same(got, elementwise(case, lambda e, _v, n=name: getattr(e, n)), dtype, name, tolerances)
    entropy = d.entropy()
    assert_same(entropy, elementwise(case, lambda e, _v: e.entropy()), dtype, "entropy", QUADRATURE_TOL)
    moments = d.moments()
    for got, name in zip(moments, ("mean", "1 - mean", "variance")):
        assert got.shape == d.batch_shape
    assert_same(moments[0], d.mean, dtype, "moments mean")
    one_total = (d.prob_zero + d.prob_one + d.prob_continuous).double()
    assert torch.allclose(one_total, torch.ones_like(one_total), atol=1e-6 if dtype == torch.float32 else 1e-14)
    flat = {n: getattr(d, n).reshape(-1).tolist() for n in ("prob_zero", "prob_one", "mean", "variance")}
    flat["entropy"] = entropy.reshape(-1).tolist()
    for i, (a, b, l, u) in enumerate(grid(case)):
        if math.isinf(a):
            point = 1.0 if a > 0 else 0.0
            assert (flat["mean"][i], flat["variance"][i], flat["entropy"][i]) == (point, 0.0, 0.0)
            assert (flat["prob_zero"][i], flat["prob_one"][i]) == (1.0 - point, point)
        elif dtype == torch.float64:
            h, scale = ref.entropy(a, b, l, u)
            assert abs(flat["entropy"][i] - h) <= 1e-9 * scale + 1e-300, (a, b, l, u)
            atoms = ref.atoms(a, b, l, u)
            assert flat["prob_zero"][i] == pytest.approx(atoms["p0"], rel=1e-10, abs=1e-300)


test_expectations, test_expectations_long = _expectations


@_probe(parameter_sets(any_log_alpha))
def _expand(case):
    """expand keeps the type, the values and validate_args; a new leading dimension broadcasts."""
    d = build(case)
    e = d.expand((2,) + tuple(d.batch_shape))
    assert type(e) is HardConcrete and e._validate_args == d._validate_args
    assert_same(e.prob_zero, d.prob_zero.expand(e.batch_shape), case["dtype"], "expand")
    assert_same(
        e.log_prob(torch.zeros((), dtype=case["dtype"])),
        d.log_prob(torch.zeros((), dtype=case["dtype"])).expand(e.batch_shape),
        case["dtype"],
        "expand log_prob",
    )


test_expand, test_expand_long = _expand


# ---------------------------------------------------------------------------------------- KL
@st.composite
def kl_pairs(draw):
    q = draw(parameter_sets(any_log_alpha))
    prior_form = draw(st.sampled_from(["same stretch", "other temperature", "other stretch"]))
    ap = draw(finite_log_alpha)
    bp = q["b"][0] if prior_form == "same stretch" else draw(temperatures)
    lp, up = (q["l"], q["u"]) if prior_form != "other stretch" else (draw(lowers), draw(uppers))
    return q, (ap, bp, lp, up)


@_probe(kl_pairs(), examples=12, slow_examples=150)
def _kl(pair):
    """kl_hard_concrete (and torch's kl_divergence) in every form: elementwise, SciPy's Eq. 28, limits."""
    case, prior = pair
    dtype = case["dtype"]
    q = build(case)
    p = HardConcrete(*(torch.tensor(x, dtype=dtype) for x in prior))
    got = kl_hard_concrete(q, p)
    assert got.shape == q.batch_shape
    assert_same(torch.distributions.kl_divergence(q, p), got, dtype, "registered KL")
    expected = elementwise(case, lambda e, _v: kl_hard_concrete(e, one(prior, dtype)))
    # the shared-scalars path and the general path evaluate the same sum in another order
    rtol, atol = (1e-4, 1e-5) if dtype == torch.float32 else (1e-10, 1e-12)
    torch.testing.assert_close(got.double(), expected.double(), rtol=rtol, atol=atol, equal_nan=True)
    assert (got >= -atol).all() and torch.isfinite(got).all()
    at = ref.atoms(*prior)
    for (a, b, l, u), k in zip(grid(case), got.reshape(-1).tolist()):
        if math.isinf(a):  # KL of a point mass: -log P(atom) under the prior
            expected_k = -(at["log_p1"] if a > 0 else at["log_p0"])
            assert k == pytest.approx(expected_k, rel=1e-5 if dtype == torch.float32 else 1e-10)
        elif dtype == torch.float64:
            ref_k, scale = ref.kl((a, b, l, u), prior)
            assert abs(k - ref_k) <= 1e-8 * scale + 1e-12, ((a, b, l, u), prior)


test_kl_forms, test_kl_forms_long = _kl


@pytest.mark.parametrize("num_nodes", [0, -3, 2.5, True, "8"])
@pytest.mark.parametrize("stretch", ["same", "other"])
def test_kl_num_nodes_is_named(num_nodes, stretch):
    """A bad num_nodes is a ValueError naming num_nodes, on each code path of the KL."""
    q = HardConcrete(torch.zeros(3))
    p = HardConcrete(torch.tensor(0.5)) if stretch == "same" else HardConcrete(torch.zeros(3), 0.5, -0.2, 1.2)
    with pytest.raises(ValueError, match="num_nodes"):
        kl_hard_concrete(q, p, num_nodes=num_nodes)
    with pytest.raises(ValueError, match="num_nodes"):
        q.entropy(num_nodes=num_nodes)


def test_kl_against_a_point_mass_prior():
    """A prior at log_alpha = +inf: KL is inf unless q is the same point mass (then 0)."""
    p = HardConcrete(torch.tensor(math.inf, dtype=torch.float64), validate_args=False)
    q = HardConcrete(torch.tensor([0.0, math.inf, -math.inf], dtype=torch.float64), validate_args=False)
    assert kl_hard_concrete(q, p).tolist() == [math.inf, 0.0, math.inf]


# ---------------------------------------------------------------------------------------- gradients
@pytest.mark.parametrize("value", [0.0, 1.0, 0.37])
@pytest.mark.parametrize("form", ["float-params", "0dim", "batch"])
def test_log_prob_gradcheck_every_form(value, form):
    """d log_prob / d log_alpha by finite differences, at the atoms too, on each code path."""
    z = torch.tensor(value, dtype=torch.float64)
    if form == "batch":
        z = z.expand(3)
    start = torch.tensor(0.3, dtype=torch.float64) if form != "batch" else torch.tensor([-1.0, 0.3, 2.0])

    def fn(log_alpha):
        if form == "float-params":
            return HardConcrete(log_alpha, 0.5, -0.1, 1.1).log_prob(z)
        t = [torch.tensor(x, dtype=torch.float64) for x in (0.5, -0.1, 1.1)]
        return HardConcrete(log_alpha, *t).log_prob(z)

    assert torch.autograd.gradcheck(fn, (start.double().requires_grad_(),))


def test_limits_have_zero_gradient():
    """At log_alpha = +-inf the entropy and the KL are flat: a zero gradient, not NaN."""
    a = torch.tensor([math.inf, -math.inf], dtype=torch.float64, requires_grad=True)
    q = HardConcrete(a, validate_args=False)
    total = q.entropy().sum() + kl_hard_concrete(q, HardConcrete(torch.zeros((), dtype=torch.float64))).sum()
    (grad,) = torch.autograd.grad(total, a)
    assert grad.tolist() == [0.0, 0.0]
