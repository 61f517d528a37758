r"""A scikit-learn feature selector around :func:`~l0bayes.selection.select_variables`.

:class:`VariableSelector` is a ``SelectorMixin`` + ``BaseEstimator``: it works in a ``Pipeline``,
with ``clone``, ``GridSearchCV`` and ``set_output(transform="pandas")``, on numpy arrays, torch tensors
and pandas DataFrames (whose column names it keeps). scikit-learn is imported by this module only, and
:mod:`l0bayes.selection` imports this module on first use of the name, so ``import l0bayes.selection`` does
not load scikit-learn (nor the pandas it loads).
"""

import numbers

import numpy as np
import torch

from .api import select_variables

try:
    from sklearn.base import BaseEstimator
    from sklearn.feature_selection import SelectorMixin
    from sklearn.utils import check_random_state
    from sklearn.utils.validation import check_is_fitted
except ImportError:  # pragma: no cover - depends on the environment
    _SKLEARN = False

    class BaseEstimator:  # stand-ins, so that the class exists; constructing it says what to install
        pass

    class SelectorMixin:
        pass

else:
    _SKLEARN = True

__all__ = ["VariableSelector"]


def _validate_data(estimator, *args, **kwargs):
    """scikit-learn's ``validate_data`` (a function from 1.6, a method before)."""
    try:
        from sklearn.utils.validation import validate_data
    except ImportError:  # pragma: no cover - scikit-learn < 1.6
        return estimator._validate_data(*args, **kwargs)
    return validate_data(estimator, *args, **kwargs)


class VariableSelector(SelectorMixin, BaseEstimator):
    r"""Keep the features whose posterior inclusion probability is at least ``threshold``.

    ``fit(X, y)`` runs :func:`~l0bayes.selection.select_variables` with this estimator's
    parameters, which are that function's own arguments (same names, same defaults, same meaning),
    except ``seed``, which is scikit-learn's ``random_state``, plus ``threshold``. The default threshold 0.5
    keeps the median-probability model.

    :param str family: ``"gaussian"`` (real ``y``) or ``"bernoulli"`` (two classes: any two labels;
        the larger one, in sorted order, is the class ``1`` of the model).
    :param prior_inclusion: :math:`\pi_0` (``None``: estimated).
    :param slab_scale: :math:`\tau`, per standard deviation of a feature (``None``: estimated).
    :param noise_scale: :math:`\sigma` (``None``: estimated; Gaussian family).
    :param str method: ``"auto"``, ``"mcmc"`` or ``"variational"``.
    :param time_budget: at most this many seconds for the sampler (``None``: 15).
    :param int num_draws: importance-sampling draws per round.
    :param random_state: the seed of every random draw of the fit, as scikit-learn takes it: an int in
        ``[0, 2**64)`` is ``select_variables``' ``seed`` (default 0: the same data give the same selection);
        ``None`` draws the seed from numpy's global random state, a ``numpy.random.RandomState`` or
        ``numpy.random.Generator`` from itself (a new seed at each fit).
    :param device: where to compute (``None``: the device of a tensor ``X``, else the CPU).
    :param dtype: a torch floating dtype (``None``: ``torch.float64``).
    :param threads: torch's thread count during the fit, as in ``select_variables``.
    :param options: ``None`` or a dict of ``select_variables``' advanced options (``num_effects``,
        ``mcmc_steps``, ...).
    :param float threshold: a feature is selected when its inclusion probability is at least this (as
        ``SelectFromModel``'s threshold), in :math:`[0, 1]`. It is read when the selection is asked for, so
        changing it needs no new fit. A probability that no check vouches for is capped at 0.9
        (``result_.capped``): it stands for "0.9 or more", so ``threshold=0.9`` keeps it and a threshold above
        0.9 keeps checked probabilities only. A threshold that no feature reaches selects none: ``transform``
        then returns zero columns, with scikit-learn's warning.

    :ivar inclusion_probabilities_: ``(p,)`` numpy, :math:`P(\gamma_j = 1 \mid y)`.
    :ivar diagnostic_: the result's one line on whether to trust them (``SelectionResult.diagnostic``).
    :ivar reliable_: ``True`` when the probabilities come from a passed check or a mixed sampler.
    :ivar result_: the whole :class:`~l0bayes.selection.SelectionResult` (credible sets,
        coefficients, ``summary()``, ``plot()``).
    :ivar n_features_in_: the number of columns of ``X``.
    :ivar feature_names_in_: the column names, when ``X`` was a DataFrame with string column names.
    :ivar classes_: the two labels of ``y`` (``family="bernoulli"`` only).

    ``transform`` returns a numpy array for array and DataFrame input (a DataFrame after
    ``set_output(transform="pandas")``) and a tensor for tensor input.
    """

    def __init__(
        self,
        family="gaussian",
        prior_inclusion=None,
        slab_scale=None,
        noise_scale=None,
        method="auto",
        time_budget=None,
        num_draws=2000,
        random_state=0,
        device=None,
        dtype=None,
        threads="auto",
        options=None,
        threshold=0.5,
    ):
        if not _SKLEARN:  # pragma: no cover - depends on the environment
            raise ImportError("VariableSelector needs scikit-learn: pip install scikit-learn")
        # scikit-learn's rule: store the parameters as given; they are checked by fit()
        self.family = family
        self.prior_inclusion = prior_inclusion
        self.slab_scale = slab_scale
        self.noise_scale = noise_scale
        self.method = method
        self.time_budget = time_budget
        self.num_draws = num_draws
        self.random_state = random_state
        self.device = device
        self.dtype = dtype
        self.threads = threads
        self.options = options
        self.threshold = threshold

    # ------------------------------------------------------------------ scikit-learn's protocol
    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.target_tags.required = True
        return tags

    def _more_tags(self):  # pragma: no cover - scikit-learn < 1.6
        return {"requires_y": True}

    def fit(self, X, y):
        """Select variables: run ``select_variables(X, y, ...)`` with this estimator's parameters.

        :param X: ``(n, p)`` numpy array, torch tensor or pandas DataFrame.
        :param y: ``(n,)`` targets: real (``family="gaussian"``) or two labels (``"bernoulli"``).
        :returns: ``self``.
        """
        if self.options is not None and not isinstance(self.options, dict):
            raise TypeError(f"options must be None or a dict of select_variables' options, got {self.options!r}")
        self._check_threshold()
        if isinstance(X, torch.Tensor):
            x, target = self._tensor_input(X, y)
        else:
            x, target = _validate_data(
                self, X, y, dtype=np.float64, ensure_min_samples=3, y_numeric=self.family != "bernoulli"
            )
            # a DataFrame's values may be a read-only view (pandas' copy-on-write), which torch warns about
            x = x if x.flags.writeable else x.copy()
            target = target if target.flags.writeable else target.copy()
        self.__dict__.pop("classes_", None)  # from an earlier fit with family="bernoulli"
        if self.family == "bernoulli":
            target = self._binary_target(target)
        names = getattr(self, "feature_names_in_", None)
        arguments = dict(
            family=self.family,
            prior_inclusion=self.prior_inclusion,
            slab_scale=self.slab_scale,
            noise_scale=self.noise_scale,
            feature_names=None if names is None else list(names),
            device=self.device,
            num_draws=self.num_draws,
            seed=self._seed(),
            method=self.method,
            time_budget=self.time_budget,
            threads=self.threads,
            **(self.options or {}),
        )
        if self.dtype is not None:
            arguments["dtype"] = self.dtype
        result = select_variables(x, target, **arguments)
        self.result_ = result
        self.inclusion_probabilities_ = np.asarray(result.inclusion_probabilities, dtype=np.float64)
        self.diagnostic_ = result.diagnostic
        self.reliable_ = bool(result.reliable)
        return self

    def _get_support_mask(self):
        check_is_fitted(self, "inclusion_probabilities_")
        return self.inclusion_probabilities_ >= self._check_threshold()

    def transform(self, X):
        """``X`` reduced to the selected columns (a tensor stays a tensor, on its device)."""
        if isinstance(X, torch.Tensor):
            mask = self.get_support()
            if X.dim() != 2:
                raise ValueError(f"X must have shape (n, p), got a tensor of shape {tuple(X.shape)}")
            if X.shape[1] != self.n_features_in_:
                raise ValueError(
                    f"X has {X.shape[1]} features, but {type(self).__name__} is expecting "
                    f"{self.n_features_in_} features as input."
                )
            return X[:, torch.as_tensor(np.flatnonzero(mask), device=X.device)]
        return super().transform(X)

    def selected(self):
        """The selected features: their names when ``X`` had column names, else their column indices."""
        support = np.flatnonzero(self.get_support())
        names = getattr(self, "feature_names_in_", None)
        return support if names is None else np.asarray(names, dtype=object)[support]

    # ------------------------------------------------------------------ inputs
    def _seed(self):
        """The fit's seed from ``random_state`` (scikit-learn's ``check_random_state``, and a ``Generator``)."""
        state = self.random_state
        if isinstance(state, np.random.Generator):
            return int(state.integers(2**63))
        if state is None or isinstance(state, np.random.RandomState):
            return int(check_random_state(state).randint(2**63 - 1, dtype=np.int64))
        what = f"random_state must be None, an int in [0, 2**64), a numpy RandomState or Generator, got {state!r}"
        if isinstance(state, numbers.Integral) and not isinstance(state, bool):
            if 0 <= state < 2**64:
                return int(state)
            raise ValueError(what)
        raise TypeError(what)

    def _check_threshold(self):
        t = self.threshold
        if isinstance(t, bool) or not isinstance(t, numbers.Real) or not 0.0 <= t <= 1.0:
            raise ValueError(
                f"threshold must be a number in [0, 1] (the inclusion probability a selected feature reaches), "
                f"got {t!r}"
            )
        return float(t)

    def _tensor_input(self, X, y):
        """A tensor ``X`` goes to ``select_variables`` as it is (its device kept); record its width."""
        if X.dim() != 2:
            raise ValueError(f"X must have shape (n, p), got a tensor of shape {tuple(X.shape)}")
        if y is None:
            raise ValueError(f"{type(self).__name__} requires y to be passed, but the target y is None.")
        self.n_features_in_ = int(X.shape[1])
        self.__dict__.pop("feature_names_in_", None)  # from an earlier fit on a DataFrame
        return X.detach(), y

    def _binary_target(self, y):
        """Two labels to 0/1 (the larger label is 1); ``classes_`` keeps them."""
        labels = y.detach().cpu().numpy() if isinstance(y, torch.Tensor) else np.asarray(y)
        labels = labels.reshape(-1) if labels.ndim == 2 and labels.shape[1] == 1 else labels
        classes = np.unique(labels)
        if labels.ndim != 1 or classes.size != 2:
            raise ValueError(
                f"family='bernoulli' needs y with exactly two classes, got {classes.size} "
                f"({classes[:5].tolist()}{' ...' if classes.size > 5 else ''})"
            )
        self.classes_ = classes
        target = (labels == classes[1]).astype(np.float64)
        if isinstance(y, torch.Tensor):
            return torch.as_tensor(target, device=y.device)
        return target
