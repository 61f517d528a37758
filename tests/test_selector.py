"""``VariableSelector``: select_variables as a scikit-learn selector (Pipeline, clone, GridSearchCV, DataFrames)."""

import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch

sklearn = pytest.importorskip("sklearn")

from sklearn.base import clone  # noqa: E402
from sklearn.exceptions import NotFittedError  # noqa: E402
from sklearn.linear_model import LinearRegression  # noqa: E402
from sklearn.model_selection import GridSearchCV  # noqa: E402
from sklearn.pipeline import Pipeline  # noqa: E402

import l0bayes  # noqa: E402
from l0bayes.selection import VariableSelector  # noqa: E402

FAST = dict(method="variational", num_draws=300)  # the fit and its check, no sampler: fast enough for many fits


def _data(n=60, p=6, seed=0):
    """Two strong features (0 and 3), the others noise."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, p))
    y = 2.0 * x[:, 0] - 1.5 * x[:, 3] + rng.standard_normal(n)
    return x, y


def _quiet(fn, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # select_variables warns when a check fails
        return fn(*args, **kwargs)


def test_models_import_without_sklearn_and_the_selector_says_what_to_install():
    code = (
        "import sys, l0bayes.selection as m\n"
        "print('sklearn' in sys.modules)\n"  # the selector loads scikit-learn on first use only
        "sys.modules['sklearn'] = None\n"  # as if it were not installed
        "try:\n    m.VariableSelector()\nexcept ImportError as err:\n    print(err)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == ["False", "VariableSelector needs scikit-learn: pip install scikit-learn"]


def test_same_answer_as_select_variables():
    x, y = _data()
    selector = _quiet(VariableSelector(prior_inclusion=0.3, **FAST).fit, x, y)
    direct = _quiet(l0bayes.select_variables, x, y, prior_inclusion=0.3, **FAST)
    np.testing.assert_array_equal(selector.inclusion_probabilities_, direct.inclusion_probabilities)
    assert selector.diagnostic_ == direct.diagnostic and selector.reliable_ == direct.reliable
    np.testing.assert_array_equal(selector.result_.coefficients, direct.coefficients)
    np.testing.assert_array_equal(selector.get_support(indices=True), direct.selected(0.5))
    np.testing.assert_array_equal(selector.selected(), direct.selected(0.5))
    assert selector.selected().tolist() == [0, 3]  # the two real effects, nothing else
    np.testing.assert_array_equal(selector.transform(x), x[:, [0, 3]])
    assert selector.n_features_in_ == 6 and not hasattr(selector, "feature_names_in_")


def test_threshold_is_read_at_selection_time_and_checked():
    x, y = _data()
    selector = _quiet(VariableSelector(**FAST).fit, x, y)
    pip = selector.inclusion_probabilities_
    for threshold in (0.0, 0.05, 0.5, 0.99):
        selector.set_params(threshold=threshold)  # no new fit needed
        np.testing.assert_array_equal(selector.get_support(), pip > threshold)
    for bad in (1.5, -0.1, "0.5", None, True, float("nan")):
        selector.set_params(threshold=bad)  # scikit-learn's rule: set_params does not check
        with pytest.raises(ValueError, match="threshold must be a number in"):
            selector.get_support()
        with pytest.raises(ValueError, match="threshold must be a number in"):
            VariableSelector(threshold=bad).fit(x, y)


def test_options_and_unfitted():
    x, y = _data()
    with pytest.raises(TypeError, match="options must be None or a dict"):
        VariableSelector(options=[("mcmc_steps", 10)]).fit(x, y)
    with pytest.raises(NotFittedError):
        VariableSelector().transform(x)
    with pytest.raises(NotFittedError):
        VariableSelector().selected()
    # options reach select_variables: an unknown one is its TypeError
    with pytest.raises(TypeError, match="unknown options"):
        VariableSelector(options={"num_chain": 2}, **FAST).fit(x, y)


def test_clone_and_params_round_trip():
    selector = VariableSelector(prior_inclusion=0.2, slab_scale=0.5, options={"num_effects": 4}, threshold=0.3)
    params = selector.get_params()
    assert params["prior_inclusion"] == 0.2 and params["options"] == {"num_effects": 4} and params["threshold"] == 0.3
    copy = clone(selector)
    assert copy.get_params() == params and copy is not selector
    assert copy.options is not selector.options  # clone copies what it cannot clone
    copy.set_params(prior_inclusion=0.7, threshold=0.9, dtype=torch.float32)
    assert copy.get_params()["prior_inclusion"] == 0.7 and copy.get_params()["threshold"] == 0.9
    assert clone(copy).get_params()["dtype"] is torch.float32
    assert selector.get_params() == params  # the original is unchanged
    # a fitted selector clones to an unfitted one with the same parameters
    x, y = _data()
    fitted = _quiet(VariableSelector(**FAST).fit, x, y)
    fresh = clone(fitted)
    assert not hasattr(fresh, "inclusion_probabilities_") and fresh.get_params() == fitted.get_params()


def test_in_a_pipeline_with_linear_regression():
    x, y = _data()
    pipe = _quiet(Pipeline([("select", VariableSelector(**FAST)), ("ols", LinearRegression())]).fit, x, y)
    kept = pipe.named_steps["select"].get_support()
    assert kept.tolist() == [True, False, False, True, False, False]
    ols = LinearRegression().fit(x[:, kept], y)  # the same regression on the selected columns by hand
    np.testing.assert_allclose(pipe.named_steps["ols"].coef_, ols.coef_, rtol=1e-12)
    np.testing.assert_allclose(pipe.predict(x[:5]), ols.predict(x[:5, kept]), rtol=1e-12)


def test_grid_search_over_threshold_and_prior_inclusion():
    x, y = _data(n=45, p=5)
    pipe = Pipeline([("select", VariableSelector(**FAST)), ("ols", LinearRegression())])
    grid = {"select__threshold": [0.5, 0.999], "select__prior_inclusion": [0.1, 0.5]}
    search = _quiet(GridSearchCV(pipe, grid, cv=3).fit, x, y)
    assert len(search.cv_results_["params"]) == 4
    # threshold 0.999 keeps nothing certain enough or only the sure features; either way a fit per split ran
    assert np.isfinite(search.cv_results_["mean_test_score"]).all()
    best = search.best_estimator_.named_steps["select"]
    assert best.get_params()["threshold"] == search.best_params_["select__threshold"]
    # the refitted best selector is the selector fitted on all the data with those parameters
    chosen = {name.removeprefix("select__"): value for name, value in search.best_params_.items()}
    alone = _quiet(VariableSelector(**FAST, **chosen).fit, x, y)
    np.testing.assert_array_equal(best.inclusion_probabilities_, alone.inclusion_probabilities_)


def test_dataframe_keeps_column_names():
    pd = pytest.importorskip("pandas")
    x, y = _data()
    frame = pd.DataFrame(x, columns=[f"gene_{j}" for j in range(x.shape[1])])
    selector = _quiet(VariableSelector(**FAST).fit, frame, pd.Series(y))
    assert selector.feature_names_in_.tolist() == list(frame.columns)
    assert selector.selected().tolist() == ["gene_0", "gene_3"]
    assert selector.get_feature_names_out().tolist() == ["gene_0", "gene_3"]
    assert selector.result_.feature_names == list(frame.columns)
    np.testing.assert_array_equal(selector.transform(frame), x[:, [0, 3]])
    out = selector.set_output(transform="pandas").transform(frame)
    assert isinstance(out, pd.DataFrame) and list(out.columns) == ["gene_0", "gene_3"]
    # the same numbers as on the bare array
    bare = _quiet(VariableSelector(**FAST).fit, x, y)
    np.testing.assert_array_equal(selector.inclusion_probabilities_, bare.inclusion_probabilities_)
    # refitted on an array, the names of the earlier fit are gone
    _quiet(selector.fit, x, y)
    assert not hasattr(selector, "feature_names_in_") and selector.selected().tolist() == [0, 3]


def test_tensor_input_stays_a_tensor():
    x, y = _data()
    xt, yt = torch.as_tensor(x), torch.as_tensor(y)
    selector = _quiet(VariableSelector(**FAST).fit, xt, yt)
    bare = _quiet(VariableSelector(**FAST).fit, x, y)
    np.testing.assert_array_equal(selector.inclusion_probabilities_, bare.inclusion_probabilities_)
    out = selector.transform(xt)
    assert isinstance(out, torch.Tensor) and torch.equal(out, xt[:, [0, 3]])
    assert selector.selected().tolist() == [0, 3] and selector.n_features_in_ == 6
    with pytest.raises(ValueError, match="X has 5 features, but VariableSelector is expecting 6"):
        selector.transform(xt[:, :5])
    with pytest.raises(ValueError, match="X must have shape"):
        VariableSelector(**FAST).fit(xt[0], yt)


def test_bernoulli_takes_any_two_labels():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((80, 4))
    y01 = (x[:, 1] + 0.3 * rng.standard_normal(80) > 0).astype(float)
    labels = np.where(y01 == 1, "yes", "no")
    options = {"max_steps": 60}
    selector = _quiet(VariableSelector(family="bernoulli", options=options, **FAST).fit, x, labels)
    assert selector.classes_.tolist() == ["no", "yes"]
    direct = _quiet(l0bayes.select_variables, x, y01, family="bernoulli", max_steps=60, **FAST)
    np.testing.assert_array_equal(selector.inclusion_probabilities_, direct.inclusion_probabilities)
    with pytest.raises(ValueError, match="exactly two classes, got 3"):
        VariableSelector(family="bernoulli", **FAST).fit(x, np.arange(80) % 3)
    # refitted as gaussian, no classes_ are left from the bernoulli fit
    _quiet(selector.set_params(family="gaussian").fit, x, y01)
    assert not hasattr(selector, "classes_")


def test_scikit_learn_estimator_checks():
    from sklearn.utils.estimator_checks import check_estimator

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        results = check_estimator(VariableSelector(**FAST), on_fail=None)
    failed = [(r["check_name"], repr(r["exception"])) for r in results if r["status"] == "failed"]
    assert failed == []
    assert sum(r["status"] == "passed" for r in results) > 40
