r"""Variable selection you can check: :func:`select_variables`, its parts, and the exact references.

Which columns of ``X`` matter for ``y``? :func:`select_variables` answers with posterior inclusion
probabilities of the spike-and-slab model, each produced by a method that says whether to trust it:

* :mod:`~l0bayes.selection.api`: :func:`select_variables`, the order of its steps;
  :mod:`~l0bayes.selection.arguments` checks its arguments and standardises the data;
  :mod:`~l0bayes.selection.result` holds :class:`SelectionResult`.
* The fit: a sum of single effects (:func:`fit_single_effects`, :mod:`~l0bayes.selection.single_effects`) for
  the Gaussian family (:mod:`~l0bayes.selection.gaussian`), the mean-field hard concrete model for the Bernoulli
  family (:mod:`~l0bayes.selection.bernoulli`).
* The check: Pareto-smoothed importance sampling of the fit against the exact collapsed posterior
  (:func:`importance_check`, :mod:`~l0bayes.selection.importance`).
* The exact sampler: weighted tempered Gibbs sampling (:func:`tempered_gibbs`, :mod:`l0bayes.selection.sampler`),
  for as long as a :class:`RunLength` says, started from the fit (:mod:`~l0bayes.selection.mcmc`).
* The reference: :func:`exact_inclusion_probabilities` by enumerating all :math:`2^p` models
  (:mod:`~l0bayes.selection.exact`).
* :class:`VariableSelector`: :func:`select_variables` as a scikit-learn feature selector, imported on first use
  (PEP 562) so that ``import l0bayes.selection`` does not load scikit-learn.
"""

from typing import TYPE_CHECKING

from .api import select_variables
from .exact import ExactSpikeSlab, exact_inclusion_probabilities, log_marginal_likelihood, ols_noise_scale
from .importance import ImportanceCheck, gate_importance_check, importance_check, khat_meaning
from .result import SelectionResult
from .sampler.diagnostics import TemperedGibbsResult
from .sampler.gibbs import tempered_gibbs
from .sampler.run_length import RunLength
from .single_effects import SingleEffectsFit, credible_sets, fit_single_effects

if TYPE_CHECKING:  # pragma: no cover - for static analysis and documentation tools
    from .selector import VariableSelector

__all__ = [
    "ExactSpikeSlab",
    "ImportanceCheck",
    "RunLength",
    "SelectionResult",
    "SingleEffectsFit",
    "TemperedGibbsResult",
    "VariableSelector",
    "credible_sets",
    "exact_inclusion_probabilities",
    "fit_single_effects",
    "gate_importance_check",
    "importance_check",
    "khat_meaning",
    "log_marginal_likelihood",
    "ols_noise_scale",
    "select_variables",
    "tempered_gibbs",
]


def __getattr__(name):
    if name == "VariableSelector":
        from .selector import VariableSelector

        return VariableSelector
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
