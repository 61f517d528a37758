"""Property-based probes of ``train()``'s argument edges: dtypes, sizes, seeds, non-finite values, empty data.

Every property checks an outcome: a ``TypeError`` / ``ValueError`` whose message names the argument (and
the values), or a finite run equal to a reference run (the same data in another dtype, another batch size
that means the same, the same seed again). Each runs twice: a few examples in the default run, many more
under ``-m slow``. The models are tiny and train for one epoch.
"""

import argparse
import math
import re

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from l0bayes.cli.arguments import _seed as parse_seed
from l0bayes.inference import Constrained, NonFiniteLossError, clipped, train
from l0bayes.inference.callbacks import Callback
from l0bayes.models import SparseClassifier, SparseLinearRegression, SparseModel
from l0bayes.nn import L0MLP

#: Examples per property: the default run, and the ``slow`` profile.
FAST, SLOW = 12, 200
PROFILES = [pytest.param(FAST, id="fast"), pytest.param(SLOW, marks=pytest.mark.slow, id="slow")]
KINDS = ("classifier", "linear")
NON_FINITE = (math.nan, math.inf, -math.inf)


def _profile(examples):
    return settings(max_examples=examples, deadline=None, derandomize=True, database=None)


def _model(kind, features=4, dtype=torch.float32, drop=0.2):
    torch.manual_seed(0)
    if kind == "classifier":
        model = SparseClassifier(L0MLP(features, (3,), 3, init_drop_rates=drop))
    else:
        model = SparseLinearRegression(features)
    return model.to(dtype)


def _data(kind, n, features=4, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=g, dtype=torch.float64).to(dtype)
    y = torch.randint(0, 3, (n,), generator=g) if kind == "classifier" else torch.randn(n, generator=g)
    return x, y


def _fit(model, x, y, **kwargs):
    return train(model, x, y, **{"epochs": 1, "batch_size": 4, "progress": False, "seed": 0, **kwargs})


def _assert_same_run(a_model, a, b_model, b):
    for p, q in zip(a_model.state_dict().values(), b_model.state_dict().values(), strict=True):
        assert torch.equal(p, q)
    assert [h["mean_loss"] for h in a.history] == [h["mean_loss"] for h in b.history]
    assert all(math.isfinite(h["mean_loss"]) for h in a.history)


# ---------------------------------------------------------------------------------------------------- dtypes
@pytest.mark.parametrize("examples", PROFILES)
def test_data_must_have_the_model_dtype(examples):
    data_dtypes = (torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int32, torch.int64)

    @_profile(examples)
    @given(
        kind=st.sampled_from(KINDS),
        model_dtype=st.sampled_from((torch.float32, torch.float64)),
        data_dtype=st.sampled_from(data_dtypes),
    )
    def prop(kind, model_dtype, data_dtype):
        x, y = _data(kind, 8)
        x = x.to(data_dtype)
        if data_dtype != model_dtype:
            with pytest.raises(TypeError, match=rf"^x has dtype {data_dtype} but the model's parameters are "):
                _fit(_model(kind, dtype=model_dtype), x, y)
            return
        model = _model(kind, dtype=model_dtype)
        result = _fit(model, x, y)
        again = _model(kind, dtype=model_dtype)
        _assert_same_run(model, result, again, _fit(again, x, y))
        assert all(p.dtype == model_dtype for p in model.parameters())

    prop()


@pytest.mark.parametrize("examples", PROFILES)
def test_integer_targets_of_any_width_are_the_int64_or_float_run(examples):
    @_profile(examples)
    @given(
        kind=st.sampled_from(KINDS),
        dtype=st.sampled_from((torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)),
        seed=st.integers(0, 100),
    )
    def prop(kind, dtype, seed):
        x, _ = _data(kind, 8, seed=seed)
        g = torch.Generator().manual_seed(seed)
        low = 0 if kind == "classifier" or dtype == torch.uint8 else -20
        y = torch.randint(low, 3 if kind == "classifier" else 20, (8,), generator=g)
        reference = y if kind == "classifier" else y.to(torch.float32)
        model, ref_model = _model(kind), _model(kind)
        _assert_same_run(model, _fit(model, x, y.to(dtype)), ref_model, _fit(ref_model, x, reference))

    prop()


@pytest.mark.parametrize("examples", PROFILES)
def test_class_labels_outside_the_classes_name_the_range(examples):
    @_profile(examples)
    @given(labels=st.lists(st.integers(-5, 8), min_size=2, max_size=10), float_labels=st.booleans())
    def prop(labels, float_labels):
        x, _ = _data("classifier", len(labels))
        y = torch.tensor(labels)
        if float_labels:
            with pytest.raises(TypeError, match=r"^y has dtype torch.float32, but SparseClassifier needs integer"):
                _fit(_model("classifier"), x, y.float())
        elif min(labels) < 0 or max(labels) >= 3:
            message = rf"^y: class labels must lie in \[0, 3\), got range \[{min(labels)}, {max(labels)}\]$"
            with pytest.raises(ValueError, match=message):
                _fit(_model("classifier"), x, y)
        else:
            assert math.isfinite(_fit(_model("classifier"), x, y).history[-1]["mean_loss"])

    prop()


# ---------------------------------------------------------------------------------------------------- sizes
@pytest.mark.parametrize("examples", PROFILES)
def test_a_feature_count_other_than_the_first_layer_names_both(examples):
    @_profile(examples)
    @given(
        kind=st.sampled_from(KINDS),
        expected=st.integers(1, 10),
        given_features=st.integers(1, 10),
        drop=st.sampled_from((0.2, 0.9)),  # 0.9: most gates closed, the compact product gathers columns
        in_test_data=st.booleans(),
    )
    def prop(kind, expected, given_features, drop, in_test_data):
        model = _model(kind, features=expected, drop=drop)
        x, y = _data(kind, 6, features=expected)
        bad, _ = _data(kind, 6, features=given_features)
        args = (x, y, {"test_data": (bad, y)}) if in_test_data else (bad, y, {})
        name = "test_data\\[0\\]" if in_test_data else "x"
        if given_features == expected:
            assert math.isfinite(_fit(model, args[0], args[1], **args[2]).history[-1]["mean_loss"])
            return
        if kind == "classifier":
            message = (
                rf"^{name} has {given_features} features, but layer fc1 \(L0Linear\) takes in_features={expected}$"
            )
        else:
            message = rf"^{name} must have shape \(num_data, {expected}\) for SparseLinearRegression\(num_features="
            message += rf"{expected}\), got \(6, {given_features}\)$"
        with pytest.raises(ValueError, match=message):
            _fit(model, args[0], args[1], **args[2])

    prop()


@pytest.mark.filterwarnings("ignore:constrained. the gates are fixed")
@pytest.mark.parametrize("examples", PROFILES)
def test_a_batch_larger_than_the_data_is_one_batch_of_all_rows(examples):
    @_profile(examples)
    @given(
        kind=st.sampled_from(KINDS),
        objective=st.sampled_from(("bayes", "penalized", "constrained")),
        n=st.integers(1, 8),
        batch_size=st.integers(1, 20),
    )
    def prop(kind, objective, n, batch_size):
        x, y = _data(kind, n)
        kwargs = {"objective": Constrained(target_density=0.5) if objective == "constrained" else objective}
        model, ref_model = _model(kind), _model(kind)
        result = _fit(model, x, y, batch_size=batch_size, **kwargs)
        reference = _fit(ref_model, x, y, batch_size=min(batch_size, n), **kwargs)
        _assert_same_run(model, result, ref_model, reference)

    prop()


@pytest.mark.parametrize("examples", PROFILES)
def test_empty_or_mismatched_data_names_the_argument(examples):
    cases = {
        "no rows": (lambda x, y: (x[:0], y[:0], {}), ValueError, r"^the training data is empty \(x has no rows\)$"),
        "no test rows": (
            lambda x, y: (x, y, {"test_data": (x[:0], y[:0])}),
            ValueError,
            r"^test_data\[0\] has no rows",
        ),
        "fewer labels": (lambda x, y: (x, y[:-1], {}), ValueError, r"^x has \d+ rows but y has \d+$"),
        "scalar label": (lambda x, y: (x, y[0], {}), ValueError, r"^x has \d+ rows but y has none \(a scalar\)$"),
        "1-d x": (lambda x, y: (x[:, 0], y, {}), ValueError, r"^x must have one row per example"),
        "2-d y": (lambda x, y: (x, torch.stack([y, y], 1), {}), ValueError, r"^y must have shape \(\d+,\)"),
        "test pair": (lambda x, y: (x, y, {"test_data": (x,)}), TypeError, r"^test_data must be a pair"),
        "lists": (lambda x, y: (x.tolist(), y, {}), TypeError, r"^x and y must be torch tensors \(or x an iterable"),
    }

    @_profile(examples)
    @given(kind=st.sampled_from(KINDS), case=st.sampled_from(sorted(cases)), n=st.integers(2, 8))
    def prop(kind, case, n):
        make, error, message = cases[case]
        x, y, kwargs = make(*_data(kind, n))
        with pytest.raises(error, match=message):
            _fit(_model(kind), x, y, **kwargs)

    prop()


# ---------------------------------------------------------------------------------------------------- seeds
@pytest.mark.parametrize("examples", PROFILES)
def test_valid_seeds_reproduce_and_invalid_seeds_are_named(examples):
    @_profile(examples)
    @given(
        seed=st.one_of(
            st.integers(0, 2**64 - 1),
            st.integers(max_value=-1),
            st.integers(min_value=2**64),
            st.floats(allow_nan=True),
            st.booleans(),
            st.text(max_size=3),
        )
    )
    def prop(seed):
        x, y = _data("classifier", 6)
        integer = isinstance(seed, int) and not isinstance(seed, bool)
        if integer and 0 <= seed < 2**64:
            model, again = _model("classifier"), _model("classifier")
            _assert_same_run(model, _fit(model, x, y, seed=seed), again, _fit(again, x, y, seed=seed))
            assert parse_seed(str(seed)) == seed  # what `l0bayes fit --seed` accepts
            return
        error = ValueError if integer else TypeError
        with pytest.raises(error, match=r"^seed must be a whole number in \[0, 2\*\*64\)"):
            _fit(_model("classifier"), x, y, seed=seed)
        if integer:
            assert str(seed) in _message(error, lambda: _fit(_model("classifier"), x, y, seed=seed))
        if not isinstance(seed, str):  # (a text such as "7" is a valid --seed)
            with pytest.raises(argparse.ArgumentTypeError, match=re.escape(f"got {seed}")):
                parse_seed(str(seed))

    prop()


def _message(error, call):
    with pytest.raises(error) as info:
        call()
    return str(info.value)


# ---------------------------------------------------------------------------------------------- non-finite
@pytest.mark.parametrize("examples", PROFILES)
def test_non_finite_data_is_refused_naming_the_argument(examples):
    @_profile(examples)
    @given(
        kind=st.sampled_from(KINDS),
        where=st.sampled_from(("x", "y", "test_data[0]")),
        value=st.sampled_from(NON_FINITE),
        row=st.integers(0, 5),
        column=st.integers(0, 3),
        images=st.booleans(),
    )
    def prop(kind, where, value, row, column, images):
        if where == "y" and kind == "classifier":
            where = "x"  # integer labels hold no NaN
        x, y = _data(kind, 6)
        bad = (y if where == "y" else x).clone()
        if where == "y":
            bad[row] = value
        else:
            bad[row, column] = value
        if images and kind == "classifier":  # (n, 1, 2, 2) images through the MLP's flatten
            x, bad = (t.reshape(6, 1, 2, 2) if t.dim() == 2 else t for t in (x, bad))
        args = {"x": (bad, y, {}), "y": (x, bad, {}), "test_data[0]": (x, y, {"test_data": (bad, y)})}[where]
        with pytest.raises(ValueError, match=rf"^{re.escape(where)} contains NaN or infinite values$"):
            _fit(_model(kind), args[0], args[1], **args[2])

    prop()


@pytest.mark.filterwarnings("ignore:Encountered NaN")
@pytest.mark.parametrize("examples", PROFILES)
def test_a_non_finite_parameter_stops_training_in_the_first_epoch(examples):
    # NaN in the loss (or a parameter) is a NonFiniteLossError naming the epoch, never a silently NaN model.
    @_profile(examples)
    @given(kind=st.sampled_from(KINDS), value=st.sampled_from(NON_FINITE), choice=st.integers(0, 10**6))
    def prop(kind, value, choice):
        model = _model(kind)
        params = [(n, p) for n, p in model.named_parameters() if p.numel()]
        name, param = params[choice % len(params)]
        with torch.no_grad():
            param.view(-1)[choice % param.numel()] = value
        x, y = _data(kind, 8)
        with pytest.raises(NonFiniteLossError, match=r"epoch 1\b") as info:
            _fit(model, x, y)
        assert "non-finite objective" in str(info.value) or repr(name) in str(info.value)

    prop()


# ---------------------------------------------------------------------------------------------------- clipping
@pytest.mark.parametrize("examples", PROFILES)
def test_clipping_takes_a_positive_norm_and_names_anything_else(examples):
    """clipped(factory, max_norm, norm_type, gates): a finite max_norm > 0 (norm_type may also be inf) trains to a
    finite loss; anything else is named (the clipping itself: test_optimizer.py, against clip_grad_norm_)."""
    sgd = lambda m: torch.optim.SGD(m.parameters(), lr=0.05)  # noqa: E731
    numbers = st.one_of(
        st.floats(allow_nan=True, allow_infinity=True, width=64), st.integers(-3, 3), st.sampled_from([True, "1"])
    )

    @_profile(examples)
    @given(max_norm=numbers, norm_type=st.sampled_from([2.0, 1, math.inf, 0.0, -1.0, math.nan, None]))
    def prop(max_norm, norm_type):
        def error_of(name, value, infinite):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                return TypeError, rf"^clipped: {name} must be a number > 0, got "
            if not (value > 0 and (math.isfinite(value) or (infinite and value == math.inf))):
                return ValueError, rf"^clipped: {name} must be "
            return None

        expected = error_of("max_norm", max_norm, False) or error_of("norm_type", norm_type, True)
        if expected is not None:
            with pytest.raises(expected[0], match=expected[1]):
                clipped(sgd, max_norm, norm_type=norm_type)
            return
        x, y = _data("classifier", 8)
        result = _fit(_model("classifier"), x, y, optimizer=clipped(sgd, max_norm, norm_type=norm_type))
        assert math.isfinite(result.history[-1]["mean_loss"])

    prop()


@pytest.mark.parametrize(
    "args, error, message",
    [
        (("sgd", 1.0), TypeError, r"^clipped: optimizer must be a factory model -> torch.optim.Optimizer"),
        ((None, 1.0), TypeError, r"^clipped: optimizer must be a factory"),
        ((lambda m: torch.optim.SGD(m.parameters(), lr=0.1), 1.0, 2.0, 1), TypeError, r"^clipped: gates must be"),
    ],
)
def test_clipping_names_a_bad_optimizer_or_gates(args, error, message):
    with pytest.raises(error, match=message):
        clipped(*args)


def test_clipping_twice_or_a_factory_that_returns_no_optimiser_is_named():
    sgd = clipped(lambda m: torch.optim.SGD(m.parameters(), lr=0.1), 1.0)
    x, y = _data("classifier", 8)
    with pytest.raises(ValueError, match=r"^clipped: this optimiser already clips its gradients"):
        _fit(_model("classifier"), x, y, optimizer=clipped(sgd, 2.0))
    with pytest.raises(TypeError, match=r"^optimizer= must return a torch.optim.Optimizer, got list"):
        _fit(_model("classifier"), x, y, optimizer=clipped(lambda m: list(m.parameters()), 1.0))


# ------------------------------------------------------------------------------------ a loss model's held-out data
class _Steps(Callback):
    def __init__(self):
        self.steps = 0

    def on_step_end(self, run):
        self.steps += 1


def _loss_model():
    torch.manual_seed(0)
    return SparseModel(L0MLP(4, (3,), 3), F.cross_entropy)


@pytest.mark.parametrize("name", ["validation_data", "test_data"])
@pytest.mark.parametrize("kind", ["tensors", "batches"])
@pytest.mark.parametrize("bad_rows", ["all", "later"])
def test_held_out_labels_a_loss_model_cannot_take_name_the_argument(name, kind, bad_rows):
    """A SparseModel's held-out labels beyond its outputs are a ValueError naming the argument and the batch (not
    torch's IndexError): before the first step when the first batch has them, at the first record otherwise."""
    x, y = _data("classifier", 32)
    xv, yv = _data("classifier", 24, seed=1)
    yv = yv.clone()
    if bad_rows == "all":
        yv += 5
    else:
        yv[20] = 7  # in the third batch of 8 rows
    held_out = (xv, yv) if kind == "tensors" else [(xv[i : i + 8], yv[i : i + 8]) for i in range(0, 24, 8)]
    steps = _Steps()
    batch = 1 if bad_rows == "all" else 3
    message = rf"^batch {batch} of {name}: the model's loss_fn raised IndexError \(Target \d+ is out of bounds.\); "
    with pytest.raises(ValueError, match=message):
        _fit(_loss_model(), x, y, batch_size=8, callbacks=[steps], **{name: held_out})
    assert steps.steps == (0 if bad_rows == "all" else 4)


def test_checking_held_out_data_at_the_start_leaves_the_training_draws():
    x, y = _data("classifier", 32)
    plain, checked = _loss_model(), _loss_model()
    a = _fit(plain, x, y, batch_size=8)
    b = _fit(checked, x, y, batch_size=8, validation_data=_data("classifier", 24, seed=1))
    _assert_same_run(plain, a, checked, b)
    assert b.history[-1]["validation_loss"] > 0
