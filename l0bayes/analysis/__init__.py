r"""Posterior analysis of hard concrete gates: ArviZ data, summary tables and the paper's figures.

ArviZ, pandas and matplotlib are optional (``pip install 'l0bayes[analysis]'``) and imported only
when a function needs them, so ``import l0bayes.analysis`` itself is cheap.

* :func:`to_inference_data`: gate (and weight) draws of a trained guide with the exact
  :math:`q(z \ne 0)`, :math:`P(z = 0)`, :math:`P(z = 1)` and Eq. 13 gate alongside.
* :func:`inclusion_summary`, :func:`layer_summary`, :func:`median_probability_model`,
  :func:`pruned_architecture`: tables.
* :func:`plot_hard_concrete` (Fig. 2a), :func:`plot_expected_gate` (Fig. 2b),
  :func:`plot_inclusion_forest`, :func:`plot_gate_heatmap`, :func:`plot_expected_flops` (Fig. 3),
  :func:`plot_head_map` (a transformer's heads, layers by heads).

The exact spike-and-slab reference (:func:`~l0bayes.selection.exact_inclusion_probabilities`) and the
importance check are in :mod:`l0bayes.selection`.
"""

from .inference_data import GateLayer, gate_layers, gate_var, gate_variables, to_inference_data
from .plots import (
    plot_expected_flops,
    plot_expected_gate,
    plot_gate_heatmap,
    plot_hard_concrete,
    plot_head_map,
    plot_inclusion_forest,
)
from .summary import (
    QUANTITIES,
    gate_quantity,
    inclusion_summary,
    layer_summary,
    median_probability_model,
    pruned_architecture,
)

__all__ = [
    "GateLayer",
    "QUANTITIES",
    "gate_layers",
    "gate_quantity",
    "gate_var",
    "gate_variables",
    "inclusion_summary",
    "layer_summary",
    "median_probability_model",
    "plot_expected_flops",
    "plot_expected_gate",
    "plot_gate_heatmap",
    "plot_hard_concrete",
    "plot_head_map",
    "plot_inclusion_forest",
    "pruned_architecture",
    "to_inference_data",
]
