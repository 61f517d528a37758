"""Property-based probes of ``select_variables``' arguments and of the scales of its data.

Every outcome is checked: a ``TypeError`` / ``ValueError`` whose message names the argument, or probabilities
in ``[0, 1]`` that do not depend on what the model says cannot matter. The model standardises the columns of
``X`` and measures ``slab_scale`` and ``noise_scale`` in units of ``y``: rescaling a column of ``X`` changes
nothing, and rescaling ``y`` changes nothing when the two scales follow it (the estimated ones do by
themselves). A power of two changes no bit; any other factor changes them within Monte Carlo error only,
and they stay those of the exact posterior (:func:`~l0bayes.selection.exact_inclusion_probabilities`,
enumeration). Each property runs twice: a few examples in the default run, many more under ``-m slow``.
The problems are tiny (``n = 30``, ``p = 4``) and use ``method="variational"`` (the fit and its importance
check, no sampler) unless the sampler is the point.
"""

import math
import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from l0bayes import select_variables
from l0bayes.selection import exact_inclusion_probabilities

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

#: Examples per property: the default run, and the ``slow`` profile.
FAST, SLOW = 10, 100
PROFILES = [pytest.param(FAST, id="fast"), pytest.param(SLOW, marks=pytest.mark.slow, id="slow")]
N, P = 30, 4
HYPER = {"prior_inclusion": 0.3, "slab_scale": 1.0, "noise_scale": 1.0}
#: A factor other than a power of two changes the inputs by rounding, which can move an importance draw across
#: its threshold: the probabilities then agree within Monte Carlo error (about 0.015 at an ESS of 1,000), not bits.
MC_TOLERANCE = 0.05


def _profile(examples, share=1.0):
    """Hypothesis settings for ``share`` of ``examples`` (at least one): a property with several fits runs fewer."""
    return settings(max_examples=max(int(examples * share), 1), deadline=None, derandomize=True, database=None)


def _data(seed=0, n=N, p=P, family="gaussian"):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, p))
    signal = 1.2 * x[:, 0] - 0.8 * x[:, 1]
    if family == "bernoulli":
        return x, (signal + rng.standard_normal(n) > 0).astype(np.float64)
    return x, signal + rng.standard_normal(n)


def _standardised(x, y):
    return (x - x.mean(0)) / x.std(0, ddof=1), y - y.mean()


def _run(x, y, **kwargs):
    return select_variables(x, y, **{"method": "variational", **kwargs})


def _assert_probabilities(result):
    for values in (result.inclusion_probabilities, result.variational_probabilities):
        assert np.isfinite(values).all() and (values >= 0).all() and (values <= 1).all(), values
    assert np.isfinite(result.coefficients).all()


# ---------------------------------------------------------------------------------------------------- scales
@pytest.mark.parametrize("examples", PROFILES)
def test_power_of_two_rescaling_changes_no_bit(examples):
    @_profile(examples, 0.5)  # two fits per example
    @given(
        seed=st.integers(0, 50),
        column_powers=st.lists(st.integers(-60, 60), min_size=P, max_size=P),
        y_power=st.integers(-60, 60),
        sign=st.sampled_from((1.0, -1.0)),
        given_scales=st.booleans(),
    )
    def prop(seed, column_powers, y_power, sign, given_scales):
        x, y = _data(seed)
        hyper = dict(HYPER) if given_scales else {}
        base = _run(x, y, **hyper)
        factors = np.ldexp(1.0, np.asarray(column_powers))
        c = math.ldexp(sign, y_power)
        if given_scales:
            hyper.update(slab_scale=abs(c), noise_scale=abs(c))
        scaled = _run(x * factors, c * y, **hyper)
        np.testing.assert_array_equal(scaled.inclusion_probabilities, base.inclusion_probabilities)
        np.testing.assert_array_equal(scaled.coefficients, base.coefficients * c / factors)
        assert scaled.noise_scale == abs(c) * base.noise_scale and scaled.slab_scale == abs(c) * base.slab_scale
        _assert_probabilities(scaled)

    prop()


@pytest.mark.parametrize("examples", PROFILES)
def test_any_rescaling_keeps_the_exact_probabilities(examples):
    @_profile(examples, 0.5)  # two fits per example
    @given(
        seed=st.integers(0, 50),
        column_decades=st.lists(st.floats(-12, 12), min_size=P, max_size=P),
        y_decades=st.floats(-12, 12),
        sign=st.sampled_from((1.0, -1.0)),
        shift=st.floats(-100, 100),
    )
    def prop(seed, column_decades, y_decades, sign, shift):
        x, y = _data(seed)
        factors, c = 10.0 ** np.asarray(column_decades), sign * 10.0**y_decades
        xs, yc = _standardised(x, y)
        exact = exact_inclusion_probabilities(xs, yc, **HYPER).inclusion
        base = _run(x, y, **HYPER)
        hyper = {**HYPER, "slab_scale": abs(c), "noise_scale": abs(c)}
        # a shift of every column (up to 100 standard deviations): centring removes it
        scaled = _run((x + shift) * factors, c * y, **hyper)
        _assert_probabilities(scaled)
        assert np.abs(scaled.inclusion_probabilities - base.inclusion_probabilities).max() < MC_TOLERANCE
        if scaled.reliable:
            assert np.abs(scaled.inclusion_probabilities - exact).max() < 0.05, (scaled.inclusion_probabilities, exact)

    prop()


@pytest.mark.parametrize("examples", PROFILES)
def test_estimated_scales_follow_y(examples):
    @_profile(examples, 0.5)  # two fits per example
    @given(seed=st.integers(0, 50), column_decades=st.floats(-12, 12), y_decades=st.floats(-150, 150))
    def prop(seed, column_decades, y_decades):
        x, y = _data(seed)
        base = _run(x, y)
        c = 10.0**y_decades
        scaled = _run(x * 10.0**column_decades, c * y)
        _assert_probabilities(scaled)
        assert np.abs(scaled.inclusion_probabilities - base.inclusion_probabilities).max() < MC_TOLERANCE
        assert scaled.noise_scale == pytest.approx(c * base.noise_scale, rel=1e-4)
        assert scaled.slab_scale == pytest.approx(c * base.slab_scale, rel=1e-4)

    prop()


@pytest.mark.slow  # a logistic fit takes about a second on a shared CPU: only in the slow profile
@pytest.mark.parametrize("examples", [SLOW])
def test_bernoulli_ignores_the_scale_of_x(examples):
    @_profile(examples, 0.1)
    @given(seed=st.integers(0, 20), power=st.integers(-100, 100), decades=st.floats(-100, 100))
    def prop(seed, power, decades):
        x, y = _data(seed, family="bernoulli")
        kwargs = {"family": "bernoulli", "max_steps": 60, "prior_inclusion": 0.3, "num_draws": 500}
        base = _run(x, y, **kwargs)
        exact = _run(x * math.ldexp(1.0, power), y, **kwargs)
        np.testing.assert_array_equal(exact.inclusion_probabilities, base.inclusion_probabilities)
        rounded = _run(x * 10.0**decades, y, **kwargs)
        _assert_probabilities(rounded)
        assert np.abs(rounded.inclusion_probabilities - base.inclusion_probabilities).max() < MC_TOLERANCE

    prop()


@pytest.mark.parametrize("examples", PROFILES)
def test_given_scales_within_range_match_enumeration_and_outside_name_the_argument(examples):
    @_profile(examples)
    @given(
        seed=st.integers(0, 50),
        name=st.sampled_from(("slab_scale", "noise_scale")),
        decades=st.floats(-9, 9),
        y_decades=st.floats(-50, 50),
    )
    def prop(seed, name, decades, y_decades):
        x, y = _data(seed)
        y = y * 10.0**y_decades
        sd = y.std(ddof=1)
        hyper = {**HYPER, "slab_scale": sd, "noise_scale": sd, name: sd * 10.0**decades}
        if not -6 <= decades <= 6:
            with pytest.raises(ValueError, match=rf"^select_variables: {name} must lie within \[1e-06, 1e\+06\] x "):
                _run(x, y, **hyper)
            return
        result = _run(x, y, **hyper)
        _assert_probabilities(result)
        xs, yc = _standardised(x, y)
        exact = exact_inclusion_probabilities(xs, yc, **hyper).inclusion
        if result.reliable:
            assert np.abs(result.inclusion_probabilities - exact).max() < 0.05, (result.inclusion_probabilities, exact)

    prop()


# ---------------------------------------------------------------------------------------------------- dtypes
@pytest.mark.parametrize("examples", PROFILES)
def test_any_real_input_dtype_gives_probabilities(examples):
    numpy_dtypes = (np.float16, np.float32, np.float64, np.int32, np.int64)

    @_profile(examples, 0.5)  # two fits per example
    @given(
        seed=st.integers(0, 50),
        x_dtype=st.sampled_from(numpy_dtypes),
        y_dtype=st.sampled_from(numpy_dtypes),
        as_tensor=st.booleans(),
        dtype=st.sampled_from((torch.float32, torch.float64)),
    )
    def prop(seed, x_dtype, y_dtype, as_tensor, dtype):
        x, y = _data(seed)
        x, y = (10 * x).astype(x_dtype), (10 * y).astype(y_dtype)  # x10: integer casts keep some information
        reference = _run(x.astype(np.float64), y.astype(np.float64), dtype=dtype)
        if as_tensor:
            x, y = torch.from_numpy(x), torch.from_numpy(y)
        result = _run(x, y, dtype=dtype)
        _assert_probabilities(result)
        # the inputs are converted to float64 exactly: the same problem, the same answer
        np.testing.assert_array_equal(result.inclusion_probabilities, reference.inclusion_probabilities)

    prop()


# ---------------------------------------------------------------------------------------------------- arguments
BAD_ARGUMENTS = [
    ({"family": "poisson"}, ValueError, "family must be one of"),
    ({"family": 3}, ValueError, "family must be one of"),
    ({"method": "exact"}, ValueError, "method must be one of"),
    ({"method": ["auto"]}, ValueError, "method must be one of"),
    ({"prior_inclusion": "0.5"}, TypeError, "prior_inclusion must be a probability"),
    ({"prior_inclusion": True}, TypeError, "prior_inclusion must be a probability"),
    ({"prior_inclusion": math.nan}, ValueError, "prior_inclusion must be a probability"),
    ({"prior_inclusion": 0.0}, ValueError, "prior_inclusion must be a probability"),
    ({"prior_inclusion": 1.0}, ValueError, "prior_inclusion must be a probability"),
    ({"prior_inclusion": 1 + 1j}, TypeError, "prior_inclusion must be a probability"),
    ({"slab_scale": math.inf}, ValueError, "slab_scale must be a finite number > 0"),
    ({"slab_scale": -1.0}, ValueError, "slab_scale must be a finite number > 0"),
    ({"slab_scale": 1e-300}, ValueError, r"slab_scale must lie within \[1e-06, 1e\+06\]"),
    ({"slab_scale": 1e300}, ValueError, r"slab_scale must lie within \[1e-06, 1e\+06\]"),
    ({"slab_scale": "1"}, TypeError, "slab_scale must be a finite number > 0"),
    ({"noise_scale": 0.0}, ValueError, "noise_scale must be a finite number > 0"),
    ({"noise_scale": math.nan}, ValueError, "noise_scale must be a finite number > 0"),
    ({"noise_scale": 1e-300}, ValueError, r"noise_scale must lie within \[1e-06, 1e\+06\]"),
    ({"noise_scale": False}, TypeError, "noise_scale must be a finite number > 0"),
    ({"family": "bernoulli", "noise_scale": 1.0}, ValueError, "noise_scale is for family='gaussian'"),
    ({"family": "bernoulli", "slab_scale": 1e-300}, ValueError, r"slab_scale must lie in \[1e-06, 1e\+06\]"),
    ({"num_draws": 1}, ValueError, "num_draws must be a whole number >= 100"),
    ({"num_draws": 150.5}, ValueError, "num_draws must be a whole number >= 100"),
    ({"num_draws": "500"}, TypeError, "num_draws must be a whole number >= 100"),
    ({"num_draws": True}, TypeError, "num_draws must be a whole number >= 100"),
    ({"seed": 2**70}, ValueError, r"seed must be a whole number in \[0, 2\*\*64\)"),
    ({"seed": -1}, ValueError, r"seed must be a whole number in \[0, 2\*\*64\)"),
    ({"seed": 1.5}, TypeError, r"seed must be a whole number in \[0, 2\*\*64\)"),
    ({"seed": "3"}, TypeError, r"seed must be a whole number in \[0, 2\*\*64\)"),
    ({"seed": True}, TypeError, r"seed must be a whole number in \[0, 2\*\*64\)"),
    ({"time_budget": "10"}, TypeError, "time_budget must be a number of seconds > 0"),
    ({"time_budget": 0}, ValueError, "time_budget must be a number of seconds > 0"),
    ({"time_budget": math.nan}, ValueError, "time_budget must be a number of seconds > 0"),
    ({"time_budget": -math.inf}, ValueError, "time_budget must be a number of seconds > 0"),
    ({"dtype": torch.float16}, ValueError, "dtype must be torch.float32 or torch.float64"),
    ({"dtype": torch.int64}, ValueError, "dtype must be torch.float32 or torch.float64"),
    ({"dtype": "float64"}, ValueError, "dtype must be torch.float32 or torch.float64"),
    ({"device": 3.5}, TypeError, "device must be None, a string or a torch.device"),
    ({"device": "nowhere"}, ValueError, "device 'nowhere' cannot be used here"),
    ({"feature_names": "abcd"}, TypeError, "feature_names must be a sequence of names"),
    ({"feature_names": ["a"]}, ValueError, "feature_names holds 1 feature names for the 4 columns"),
    ({"threads": "many"}, ValueError, "threads must be"),
    ({"steps": 10}, TypeError, r"unknown options \['steps'\]"),
    ({"mcmc_steps": 0}, ValueError, "mcmc_steps must be a whole number >= 1"),
    ({"mcmc_steps": "5"}, TypeError, "mcmc_steps must be a whole number >= 1"),
    ({"num_chains": 0}, ValueError, "num_chains must be a whole number >= 1"),
    ({"num_effects": 2.5}, ValueError, "num_effects must be a whole number >= 1"),
    ({"max_iter": True}, TypeError, "max_iter must be a whole number >= 1"),
    ({"rounds": -1}, ValueError, "rounds must be a whole number >= 1"),
    ({"max_steps": math.inf}, ValueError, "max_steps must be a whole number >= 1"),
    ({"tol": 0.0}, ValueError, "tol must be a finite number > 0"),
    ({"lr": math.nan}, ValueError, "lr must be a finite number > 0"),
]


@pytest.mark.parametrize("examples", PROFILES)
def test_bad_arguments_name_the_argument(examples):
    x, y = _data()

    @_profile(examples, 3)  # an error is raised before any fit: cheap
    @given(case=st.sampled_from(BAD_ARGUMENTS), method=st.sampled_from(("auto", "variational", "mcmc")))
    def prop(case, method):
        kwargs, error, message = case
        with pytest.raises(error, match=message):
            target = (y > 0) * 1.0 if kwargs.get("family") == "bernoulli" else y
            select_variables(x, target, **{"method": method, **kwargs})

    prop()


@pytest.mark.parametrize("examples", PROFILES)
def test_numpy_and_tensor_scalars_are_the_python_numbers(examples):
    x, y = _data()
    reference = _run(x, y, num_draws=300, seed=3, time_budget=5.0, num_effects=3, tol=1e-3, **HYPER)

    @_profile(examples)
    @given(
        kind=st.sampled_from(("numpy", "numpy32", "tensor")),
        argument=st.sampled_from(("prior_inclusion", "slab_scale", "noise_scale", "num_draws", "seed", "num_effects")),
    )
    def prop(kind, argument):
        values = {"num_draws": 300, "seed": 3, "num_effects": 3, **HYPER}
        value = values[argument]
        if kind == "tensor":
            wrapped = torch.tensor(value, dtype=torch.float64 if isinstance(value, float) else torch.int64)
        elif isinstance(value, int):
            wrapped = (np.int64 if kind == "numpy" else np.uint32)(value)
        else:
            wrapped = (np.float64 if kind == "numpy" else np.float32)(value)  # 0.3 in float32 is another model
        if argument == "seed" and kind == "tensor":  # a seed is an integer exactly, a tensor is not an int
            with pytest.raises(TypeError, match="seed must be a whole number"):
                _run(x, y, **{**values, argument: wrapped})
            return
        result = _run(x, y, time_budget=np.float64(5.0), tol=np.float32(1e-3), **{**values, argument: wrapped})
        if kind == "numpy32" and argument == "prior_inclusion":
            assert result.prior_inclusion == float(np.float32(0.3))
            return
        np.testing.assert_array_equal(result.inclusion_probabilities, reference.inclusion_probabilities)

    prop()


# ---------------------------------------------------------------------------------------------------- fixed cases
def test_float64_x_with_float32_y_gives_probabilities_at_most_one():
    """Seed 5: the reweighted probability of the first feature came out as 1.0000000000000002 (a rounded sum)."""
    x, _ = _data()
    for seed in (5, 9, 12, 22, 35):
        rng = np.random.default_rng(seed)
        x = rng.standard_normal((40, 5))
        y = 2 * x[:, 0] + rng.standard_normal(40)
        for target in (y, y.astype(np.float32), torch.tensor(y, dtype=torch.float32)):
            result = _run(x, target)
            assert result.inclusion_probabilities.max() <= 1.0
            _assert_probabilities(result)


@pytest.mark.parametrize("label", [0.0, 1.0])
def test_one_class_bernoulli_y_says_so(label):
    x, _ = _data()
    with pytest.raises(ValueError, match=rf"y has one class only \(every label is {int(label)}\)"):
        select_variables(x, np.full(N, label), family="bernoulli")


@pytest.mark.parametrize(
    "x_factor, y_factor, hyper",
    [(1e-13, 1.0, {}), (1.0, 1e150, {}), (1e-200, 1e-200, {}), (1e200, 1.0, HYPER), (3.0, 1e-150, {})],
)
def test_extreme_data_scales_give_the_unscaled_answer(x_factor, y_factor, hyper):
    x, y = _data()
    base = _run(x, y, **hyper)
    if hyper:
        hyper = {**hyper, "slab_scale": y_factor, "noise_scale": y_factor}
    scaled = _run(x * x_factor, y * y_factor, **hyper)
    assert np.abs(scaled.inclusion_probabilities - base.inclusion_probabilities).max() < MC_TOLERANCE
    np.testing.assert_allclose(scaled.coefficients, base.coefficients * y_factor / x_factor, rtol=1e-3)


def test_constant_columns_are_still_found_at_any_scale():
    x, y = _data()
    for scale in (1e-200, 1.0, 1e200):
        z = x.copy() * scale
        z[:, 2] = 7.0 * scale
        with pytest.raises(ValueError, match=r"X has constant columns \[2\]"):
            _run(z, y)


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"slab_scale": math.inf}, ValueError, "slab_scale must be a finite number > 0"),
        ({"slab_scale": 1e-300}, ValueError, "slab_scale must lie within"),
        ({"num_draws": 1}, ValueError, "num_draws must be a whole number >= 100"),
        ({"seed": 2**70}, ValueError, "seed must be a whole number"),
        ({"time_budget": "10"}, TypeError, "time_budget must be a number of seconds"),
        ({"prior_inclusion": "0.5"}, TypeError, "prior_inclusion must be a probability"),
        ({"mcmc_steps": 0}, ValueError, "mcmc_steps must be a whole number >= 1"),
        ({"dtype": torch.float16}, ValueError, "dtype must be torch.float32 or torch.float64"),
    ],
)
def test_reported_crashes_are_clear_errors(kwargs, error, message):
    x, y = _data()
    with pytest.raises(error, match=message):
        select_variables(x, y, **kwargs)


def test_float16_data_is_converted():
    x, y = _data()
    x16, y16 = torch.tensor(x, dtype=torch.float16), torch.tensor(y, dtype=torch.float16)
    result = _run(x16, y16)
    reference = _run(x16.double().numpy(), y16.double().numpy())
    np.testing.assert_array_equal(result.inclusion_probabilities, reference.inclusion_probabilities)


def test_three_observations_with_a_sampler_need_the_noise_scale():
    """n = 3: two features fit any centred y exactly, where the Jeffreys posterior of the noise is improper."""
    x, y = _data(n=3, p=5)
    for method in ("mcmc", "auto"):
        with pytest.raises(ValueError, match="3 observations for 5 features: with noise_scale=None"):
            select_variables(x, y, method=method)
    # with the noise given the model is proper: the sampler's answer is the enumerated one
    result = select_variables(x, y, method="mcmc", time_budget=3.0, **HYPER)
    xs, yc = _standardised(x, y)
    exact = exact_inclusion_probabilities(xs, yc, **HYPER).inclusion
    assert np.abs(result.inclusion_probabilities - exact).max() < 0.05
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _assert_probabilities(select_variables(x, y, method="variational"))


@pytest.mark.parametrize("method", ["auto", "variational", "mcmc"])
def test_too_many_draws_are_refused_before_allocating(method):
    """num_draws=10**12 tried to allocate terabytes; the fixed maximum and the bound on num_draws * p * 8 bytes
    (2**32) are checked before any fit."""
    x, y = _data()
    with pytest.raises(ValueError, match=r"num_draws must be a whole number >= 100 and <= 10,000,000, got 10+$"):
        select_variables(x, y, num_draws=10**12, method=method)
    wide, _ = _data(p=200)
    # 4e6 draws of 200 features: 6.4e9 bytes > 2**32; the largest allowed is floor(2**32 / 1600)
    with pytest.raises(ValueError, match=r"num_draws=4000000 draws of 200 features .* give num_draws <= 2684354$"):
        select_variables(wide, y, num_draws=4_000_000, method=method)


@pytest.mark.parametrize(
    ("feature_names", "message"),
    [
        (5, "feature_names must be a sequence of names .* got int 5"),
        (iter("abcd"), "feature_names must be a sequence of names"),
        ({"a": 1}, "feature_names must be a sequence of names"),
        ([1.5, 2, 3, 4], "feature_names must be a sequence of names .* got an entry float 1.5"),
        (["a", None, "c", "d"], "feature_names must be a sequence of names .* got an entry NoneType None"),
    ],
)
def test_feature_names_that_are_no_sequence_of_names_are_type_errors(feature_names, message):
    x, y = _data()
    with pytest.raises(TypeError, match=message):
        select_variables(x, y, feature_names=feature_names)


def test_feature_names_of_strings_or_ints_are_accepted():
    x, y = _data()
    for names in (np.array(["a", "b", "c", "d"]), (3, 2, 1, 0), ["a", "b", "c", "d"]):
        assert list(_run(x, y, feature_names=names, num_draws=100).feature_names) == list(names)


def test_a_device_that_cannot_compute_is_refused():
    """device='meta' crashed in Tensor.item(); X on the meta device crashed copying out of it."""
    x, y = _data()
    with pytest.raises(ValueError, match="device is 'meta', which holds no values and cannot compute"):
        select_variables(x, y, device="meta")
    with pytest.raises(ValueError, match="the device of X is 'meta', which holds no values"):
        select_variables(torch.empty(N, P, device="meta"), y)


@pytest.mark.parametrize("examples", PROFILES)
def test_a_gaussian_y_of_two_values_warns_and_names_the_bernoulli_family(examples):
    """Any y of exactly two distinct values (scikit-learn's type_of_target: "binary"), of any dtype, numpy or tensor,
    is a UserWarning with the Gaussian family; three values or more are not; the Bernoulli family never warns."""
    x, _ = _data()

    @_profile(examples, 0.3)
    @given(
        values=st.lists(st.floats(-1e3, 1e3, allow_nan=False), min_size=2, max_size=4, unique=True),
        order=st.permutations(range(N)),
        as_tensor=st.booleans(),
    )
    def prop(values, order, as_tensor):
        target = np.asarray(values)[np.arange(N) % len(values)][list(order)]  # each value at least 7 times
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                _run(x, torch.as_tensor(target) if as_tensor else target, num_draws=100)
            except ValueError:  # values too close for the standardisation: the warning came first
                pass
        binary = [w for w in caught if w.category is UserWarning and "family='bernoulli'" in str(w.message)]
        assert len(binary) == (len(values) == 2)

    prop()
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        _run(x, (x[:, 0] > 0).astype(np.float64), family="bernoulli", num_draws=100, max_steps=30)


@pytest.mark.parametrize("examples", PROFILES)
def test_selector_random_state_is_the_seed_or_names_itself(examples):
    """VariableSelector's random_state: every int in [0, 2**64) (numpy's too) is select_variables' seed; every other
    value is an error naming random_state, before any fit."""
    pytest.importorskip("sklearn")
    from l0bayes.selection import VariableSelector

    x, y = _data()

    @_profile(examples, 0.5)
    @given(
        state=st.one_of(
            st.integers(-(2**70), 2**70),
            st.floats(allow_nan=True),
            st.text(max_size=3),
            st.booleans(),
            st.just(np.uint64(2**64 - 1)),
        )
    )
    def prop(state):
        selector = VariableSelector(random_state=state, method="variational", num_draws=100)
        whole = isinstance(state, (int, np.integer)) and not isinstance(state, bool)
        if whole and 0 <= int(state) < 2**64:
            fitted = selector.fit(x, y)
            direct = _run(x, y, num_draws=100, seed=int(state))
            np.testing.assert_array_equal(fitted.inclusion_probabilities_, direct.inclusion_probabilities)
            return
        error = ValueError if whole else TypeError
        with pytest.raises(error, match=r"random_state must be None, an int in \[0, 2\*\*64\)"):
            selector.fit(x, y)

    prop()
