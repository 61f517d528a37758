r"""Weighted tempered Gibbs sampling of the exact posterior of the inclusion indicators (Zanella & Roberts, 2019).

* :mod:`~l0bayes.selection.sampler.gibbs`: the sampler, :func:`~l0bayes.selection.tempered_gibbs`, and its
  mathematics;
* ``run_length``: how long it samples, :class:`~l0bayes.selection.RunLength`;
* :mod:`~l0bayes.selection.sampler.state`: the batched state of the chains and its rank-one updates;
* :mod:`~l0bayes.selection.sampler.diagnostics`: its result, R-hat, ESS and Monte Carlo standard errors;
* :mod:`~l0bayes.selection.sampler.convergence`: R-hat and the effective sample size of many quantities at once.

The names are exposed by :mod:`l0bayes.selection`.
"""
