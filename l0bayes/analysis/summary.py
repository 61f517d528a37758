r"""Tables of the gate posterior: inclusion probabilities per gate and per layer, the median-probability model.

All functions take the :class:`arviz.InferenceData` of
:func:`~l0bayes.analysis.to_inference_data` (posterior draws of the gates and, in the ``gates``
group, the exact quantities of :math:`q(z)`). Two kinds of numbers appear side by side:

* exact ones from the hard concrete itself: :math:`q(z \ne 0)` (Eq. 12), :math:`P(z = 0)`,
  :math:`P(z = 1)`, :math:`E[z]` (quadrature) and the test-time gate (Eq. 13);
* Monte Carlo ones from the draws via ArviZ: mean, standard deviation and highest density
  interval (HDI) of each gate value :math:`z_g`, the fraction of draws with :math:`z_g \ne 0`
  with its Monte Carlo standard error, and per layer the HDI of the number of open gates.

An inclusion indicator :math:`1[z_g \ne 0]` is Bernoulli, so its own HDI would only be
``{0, 1}``; the interval reported per gate is therefore the HDI of the gate value :math:`z_g`,
and the interval per layer is that of the count :math:`\sum_g 1[z_g \ne 0]`.
"""

import numpy as np

from .._optional import import_arviz
from .inference_data import gate_variables

QUANTITIES = ("log_alpha", "prob_nonzero", "prob_zero", "prob_one", "mean", "test_gate")


def _select(idata, var_names):
    names = gate_variables(idata)
    if var_names is None:
        return names
    var_names = [var_names] if isinstance(var_names, str) else list(var_names)
    unknown = [v for v in var_names if v not in names]
    if unknown:
        raise ValueError(f"unknown gate variables {unknown}; idata has {names}")
    return var_names


def _layer_of(idata, var):
    return idata.gates.attrs.get(f"{var}_layer", var)


def gate_quantity(idata, var, quantity="prob_nonzero"):
    """One exact per-gate quantity of layer variable ``var`` as a 1-d numpy array (``QUANTITIES``)."""
    if quantity not in QUANTITIES:
        raise ValueError(f"quantity must be one of {QUANTITIES}, got {quantity!r}")
    _select(idata, var)
    return idata.gates[f"{var}_{quantity}"].values


def inclusion_summary(idata, var_names=None, hdi_prob=0.94):
    r"""One row per gate: exact inclusion probability and the posterior summary of the gate value.

    Columns: ``layer``, ``gate`` (the coordinate label: feature name, pixel index, ...),
    ``prob_nonzero`` (exact :math:`q(z \ne 0)`, Eq. 12), ``mc_prob_nonzero`` (fraction of draws
    with :math:`z \ne 0`) and ``mcse_prob_nonzero`` (its binomial standard error), ``prob_zero``,
    ``prob_one``, ``test_gate`` (Eq. 13), then ArviZ's ``mean``, ``sd``, ``hdi_<lo>%`` and
    ``hdi_<hi>%`` of :math:`z_g` (``kind="stats"``: the draws are independent, so there are no
    chain diagnostics to report), and ``included``
    (:math:`q(z \ne 0) > 0.5`, the median-probability model).

    :returns: a :class:`pandas.DataFrame` indexed by ``"<var>[<label>]"`` (ArviZ's row names).
    """
    az = import_arviz()
    import pandas as pd

    frames = []
    for var in _select(idata, var_names):
        table = az.summary(idata, var_names=[var], kind="stats", hdi_prob=hdi_prob, round_to="none")
        draws = idata.posterior[var].values
        dim = idata.posterior[var].dims[-1]
        flat = draws.reshape(-1, draws.shape[-1])
        mc = (flat != 0).mean(0)
        q = gate_quantity(idata, var, "prob_nonzero")
        front = pd.DataFrame(
            {
                "layer": _layer_of(idata, var),
                "gate": idata.posterior[dim].values,
                "prob_nonzero": q,
                "mc_prob_nonzero": mc,
                "mcse_prob_nonzero": np.sqrt(mc * (1 - mc) / flat.shape[0]),
                "prob_zero": gate_quantity(idata, var, "prob_zero"),
                "prob_one": gate_quantity(idata, var, "prob_one"),
                "test_gate": gate_quantity(idata, var, "test_gate"),
            },
            index=table.index,
        )
        hdi_cols = [c for c in table.columns if c.startswith("hdi_")]
        back = table[["mean", "sd", *hdi_cols]]
        frame = pd.concat([front, back], axis=1)
        frame["included"] = q > 0.5
        frames.append(frame)
    return pd.concat(frames)


def layer_summary(idata, var_names=None, hdi_prob=0.94):
    r"""One row per gated layer: sizes, expected number of open gates and its HDI.

    Columns: ``num_gates``, ``group_size``, ``expected_active`` (:math:`\sum_g q(z_g \ne 0)`),
    ``active_hdi_<lo>%`` / ``active_hdi_<hi>%`` (HDI of the number of gates with :math:`z_g \ne 0`
    across the draws), ``expected_l0`` (Eq. 16: ``group_size * expected_active``),
    ``median_model`` (gates with :math:`q(z \ne 0) > 0.5`) and ``test_time`` (gates with an
    Eq. 13 gate above 0, the pruned architecture).
    """
    az = import_arviz()
    import pandas as pd

    lo, hi = 50 * (1 - hdi_prob), 50 * (1 + hdi_prob)
    rows = {}
    for var in _select(idata, var_names):
        draws = idata.posterior[var].values
        counts = (draws != 0).sum(-1).astype(float).reshape(-1)  # one count per draw
        interval = az.hdi(counts, hdi_prob=hdi_prob)
        q = gate_quantity(idata, var, "prob_nonzero")
        group = int(idata.gates.attrs.get(f"{var}_group_size", 1))
        rows[_layer_of(idata, var)] = {
            "num_gates": q.shape[0],
            "group_size": group,
            "expected_active": float(q.sum()),
            f"active_hdi_{lo:g}%": float(interval[0]),
            f"active_hdi_{hi:g}%": float(interval[1]),
            "expected_l0": float(group * q.sum()),
            "median_model": int((q > 0.5).sum()),
            "test_time": int((gate_quantity(idata, var, "test_gate") > 0).sum()),
        }
    return pd.DataFrame.from_dict(rows, orient="index")


def median_probability_model(idata, var_names=None):
    r"""The median-probability model: per layer, the labels of the gates with :math:`q(z \ne 0) > 0.5`.

    (Barbieri and Berger, 2004: under orthogonal designs the predictively optimal model.)

    :returns: ``{layer name: list of coordinate labels}``.
    """
    out = {}
    for var in _select(idata, var_names):
        q = gate_quantity(idata, var, "prob_nonzero")
        labels = idata.gates[f"{var}_prob_nonzero"].coords[idata.gates[f"{var}_prob_nonzero"].dims[0]].values
        out[_layer_of(idata, var)] = [lab.item() if hasattr(lab, "item") else lab for lab in labels[q > 0.5]]
    return out


def pruned_architecture(idata, var_names=None):
    """Number of gates kept at test time (Eq. 13 gate > 0) per layer, joined by ``-`` (Table 1 format).

    For a network this equals :func:`l0bayes.nn.architecture`; for a regression it is the number
    of features kept.
    """
    return "-".join(str(int((gate_quantity(idata, var, "test_gate") > 0).sum())) for var in _select(idata, var_names))
