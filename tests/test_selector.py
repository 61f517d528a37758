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
    for threshold in (0.0, 0.05, 0.5, 0.99, *pip):  # a feature at the threshold is selected, as by SelectFromModel
        selector.set_params(threshold=threshold)  # no new fit needed
        np.testing.assert_array_equal(selector.get_support(), pip >= threshold)
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
    with pytest.warns(UserWarning, match="two values only"):  # 0/1 labels as real numbers: a warning says so
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


def test_a_capped_probability_passes_the_threshold_0_9():
    """A probability no check vouches for is capped at exactly 0.9 ("0.9 or more"): threshold 0.9 keeps it, a
    higher one keeps the checked probabilities only (it was dropped by a strict "> threshold")."""
    x, y = _data()
    selector = _quiet(VariableSelector(**FAST).fit, x, y)
    selector.inclusion_probabilities_ = np.array([0.9, 0.2, 0.95, 0.9, 0.5, 0.89])  # 0 and 3 as if capped
    assert selector.set_params(threshold=0.9).selected().tolist() == [0, 2, 3]
    assert selector.set_params(threshold=0.91).selected().tolist() == [2]
    selector.result_.inclusion_probabilities = selector.inclusion_probabilities_  # the result's own rule is the same
    assert selector.result_.selected(0.9).tolist() == [0, 2, 3] and selector.result_.selected(0.5).tolist()[0] == 0
    with pytest.warns(UserWarning, match="No features were selected"):  # scikit-learn's empty selection
        assert selector.set_params(threshold=1.0).transform(x).shape == (60, 0)


def test_the_guides_grid_on_breast_cancer_fits_every_split():
    """The guide's GridSearchCV grid (thresholds 0.1, 0.5, 0.9) on breast cancer: where the check fails, the
    probabilities above 0.9 are capped at 0.9, and threshold 0.9 used to select nothing (4 of 5 splits failed,
    FitFailedWarning, NaN score). The 0/1 labels with the default Gaussian family are a warning of their own."""
    from sklearn.datasets import load_breast_cancer
    from sklearn.exceptions import FitFailedWarning
    from sklearn.pipeline import make_pipeline

    X, y = load_breast_cancer(return_X_y=True)
    pipe = make_pipeline(VariableSelector(method="variational", num_draws=300), LinearRegression())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        search = GridSearchCV(pipe, {"variableselector__threshold": [0.1, 0.5, 0.9]}, cv=5).fit(X, y)
    failed = [str(w.message) for w in caught if issubclass(w.category, FitFailedWarning)]
    assert failed == [] and np.isfinite(search.cv_results_["mean_test_score"]).all()
    assert not any("No features were selected" in str(w.message) for w in caught)
    assert any("family='bernoulli'" in str(w.message) for w in caught if w.category is UserWarning)


@pytest.mark.slow  # about 12 s
def test_the_guides_grid_on_breast_cancer_with_the_bernoulli_family():
    from sklearn.datasets import load_breast_cancer
    from sklearn.exceptions import FitFailedWarning
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    X, y = load_breast_cancer(return_X_y=True)
    selector = VariableSelector(family="bernoulli", method="variational", num_draws=300, options={"max_steps": 100})
    pipe = make_pipeline(selector, StandardScaler(), LogisticRegression())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        search = GridSearchCV(pipe, {"variableselector__threshold": [0.1, 0.5, 0.9]}, cv=5).fit(X, y)
    assert not any(issubclass(w.category, FitFailedWarning) for w in caught)
    assert np.isfinite(search.cv_results_["mean_test_score"]).all()


def test_two_valued_y_with_the_gaussian_family_warns():
    """scikit-learn's type_of_target calls a y of two values "binary": the Gaussian family warns and names the
    Bernoulli family; real y, or the Bernoulli family, do not warn."""
    from sklearn.utils.multiclass import type_of_target

    x, y = _data()
    labels = (y > 0).astype(float)
    assert type_of_target(labels) == "binary" and type_of_target(y) == "continuous"
    with pytest.warns(UserWarning, match=r"y takes two values only \(0 and 1\).*family='bernoulli'"):
        _quiet(VariableSelector(**FAST).fit, x, labels)
    with pytest.warns(UserWarning, match=r"two values only \(-1 and 3\)") as caught:
        _quiet(l0bayes.select_variables, x, np.where(labels == 1, 3, -1), **FAST)
    assert caught[0].filename == __file__  # it points at the caller's line
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        _quiet(VariableSelector(**FAST).fit, x, y)
        _quiet(VariableSelector(family="bernoulli", options={"max_steps": 60}, **FAST).fit, x, labels)


def test_random_state_as_scikit_learn_takes_it():
    """An int is select_variables' seed; None draws it from numpy's global state, a RandomState or a Generator from
    itself (each fit a new seed); anything else is an error naming random_state."""
    x, y = _data()

    assert "random_state" in VariableSelector().get_params() and "seed" not in VariableSelector().get_params()
    assert VariableSelector().random_state == 0
    fits = {}
    for name, state in [("int", 7), ("numpy int", np.int64(7))]:
        fits[name] = _quiet(VariableSelector(random_state=state, **FAST).fit, x, y).result_.draws
    direct = _quiet(l0bayes.select_variables, x, y, seed=7, **FAST).draws
    np.testing.assert_array_equal(fits["int"], direct)
    np.testing.assert_array_equal(fits["numpy int"], direct)
    seed = int(np.random.RandomState(3).randint(2**63 - 1, dtype=np.int64))
    by_state = _quiet(VariableSelector(random_state=np.random.RandomState(3), **FAST).fit, x, y).result_.draws
    np.testing.assert_array_equal(by_state, _quiet(l0bayes.select_variables, x, y, seed=seed, **FAST).draws)
    seed = int(np.random.default_rng(3).integers(2**63))
    by_generator = _quiet(VariableSelector(random_state=np.random.default_rng(3), **FAST).fit, x, y).result_.draws
    np.testing.assert_array_equal(by_generator, _quiet(l0bayes.select_variables, x, y, seed=seed, **FAST).draws)
    np.random.seed(5)
    seed = int(np.random.randint(2**63 - 1, dtype=np.int64))
    np.random.seed(5)
    by_global = _quiet(VariableSelector(random_state=None, **FAST).fit, x, y).result_.draws
    np.testing.assert_array_equal(by_global, _quiet(l0bayes.select_variables, x, y, seed=seed, **FAST).draws)
    generator = np.random.default_rng(0)  # one object: each fit draws a new seed
    selector = VariableSelector(random_state=generator, **FAST)
    first, second = (_quiet(selector.fit, x, y).result_.draws.copy() for _ in range(2))
    assert not np.array_equal(first, second)
    for bad, error in [(-1, ValueError), (2**64, ValueError), (1.5, TypeError), ("3", TypeError), (True, TypeError)]:
        with pytest.raises(error, match=r"random_state must be None, an int in \[0, 2\*\*64\)"):
            VariableSelector(random_state=bad, **FAST).fit(x, y)
