r"""Posterior gate draws of a trained guide as an :class:`arviz.InferenceData`.

The guides of :mod:`l0bayes.models` are mean field: every gate :math:`z_g` has its own hard
concrete :math:`q(z_g)` with a learned :math:`\log\alpha_g` (Eq. 10-11). Draws are exact and
independent, not the output of a Markov chain: they are stored as a single ``chain`` so that
nothing implies chain diagnostics. ``r_hat`` and ``ess`` do not apply (ArviZ reports them as
NaN for one chain); summarise with ``arviz.summary(idata, kind="stats")`` as
:func:`~l0bayes.analysis.inclusion_summary` does, and use the exact quantities of the ``gates``
group or the binomial error of a Monte Carlo fraction.

Layout of the returned object (see :func:`to_inference_data`):

* ``posterior``: one variable per gated layer, named :func:`gate_var` (``"z"`` for the regression
  models, ``"z_<layer>"`` for a network, e.g. ``"z_fc1"``), with dimensions
  ``("chain", "draw", <gate dim>)`` and one chain. The gate dim is ``"feature"`` for a regression and
  ``"<layer>_gate"`` for a network layer (``"fc1_gate"``: the input neurons of ``fc1``, i.e. pixel
  indices for an MLP on images; ``"conv1_gate"``: output maps). Coordinates are feature names
  where given. With ``weights=True`` also the gated coefficients :math:`\tilde\theta \odot z`:
  ``"theta"`` for a regression (the Gaussian slab is sampled too), ``"w_<layer>"`` for a network.
* ``gates`` (a custom group): per gate, the exact quantities of :math:`q(z)`, for each layer
  variable ``v``: ``v_log_alpha``, ``v_prob_nonzero`` (Eq. 12, :math:`q(z \ne 0)`),
  ``v_prob_zero`` (:math:`P(z = 0)`), ``v_prob_one`` (:math:`P(z = 1)`), ``v_mean``
  (:math:`E[z]`) and ``v_test_gate`` (the test-time gate of Eq. 13), on the same gate dimension.
* ``attrs`` of ``gates``: the layers (``"layers"``, comma separated), the model class and each
  layer's group size (``"<v>_group_size"``).
"""

from dataclasses import dataclass

import numpy as np
import torch

from .._checks import COUNT, SEED, check_args, whole
from .._optional import import_arviz
from ..distributions import HardConcrete
from ..nn.gates import HardConcreteGate, gates_of
from ..threads import under_thread_policy


@dataclass
class GateLayer:
    """A gated layer as seen by the analysis: its name, gate module, owning layer and naming.

    :ivar name: the layer's name (``"fc1"``, or ``"z"`` for a regression's coefficients).
    :ivar gate: the :class:`~l0bayes.nn.HardConcreteGate`.
    :ivar layer: the module that owns the gate (an ``L0Linear``/``L0Conv2d``, or the regression model).
    :ivar var: the posterior variable name (:func:`gate_var`).
    :ivar dim: the gate dimension's name.
    """

    name: str
    gate: HardConcreteGate
    layer: torch.nn.Module
    var: str
    dim: str


def _sanitize(name):
    return name.replace(".", "_")


def gate_var(layer_name):
    """Posterior variable of a layer's gates: ``"z"`` for a regression (layer ``"z"``), else ``"z_<layer>"``."""
    return "z" if layer_name == "z" else f"z_{_sanitize(layer_name)}"


def gate_layers(model):
    """The gated layers of ``model``, in registration order, as :class:`GateLayer` s.

    ``model`` is a :class:`~l0bayes.models.SparseLinearRegression` /
    :class:`~l0bayes.models.SparseLogisticRegression` (one layer ``"z"`` with gate dim
    ``"feature"``), a :class:`~l0bayes.models.SparseClassifier` (its ``net``), or any module with
    :class:`~l0bayes.nn.HardConcreteGate` sub-modules (a gated layer ``"fc1"`` owns ``"fc1.gate"``).
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"expected a torch.nn.Module with hard concrete gates, got {type(model).__name__}")
    if hasattr(model, "num_features") and isinstance(getattr(model, "gate", None), HardConcreteGate):
        return [GateLayer("z", model.gate, model, "z", "feature")]
    net = getattr(model, "net", model)
    modules = dict(net.named_modules())
    out = []
    for name, gate in gates_of(net):
        layer_name = name[: -len(".gate")] if name.endswith(".gate") else (name or "gate")
        owner = modules.get(layer_name, gate) if name.endswith(".gate") else gate
        clean = _sanitize(layer_name)
        out.append(GateLayer(layer_name, gate, owner, gate_var(layer_name), f"{clean}_gate"))
    if not out:
        raise ValueError(f"{type(model).__name__} has no HardConcreteGate modules")
    return out


def _layer_coords(layers, coords, feature_names):
    """Coordinates per gate dim: user ``coords`` keyed by layer name or dim, ``feature_names`` for the first layer."""
    coords = dict(coords or {})
    out = {}
    for k, gl in enumerate(layers):
        labels = coords.pop(gl.name, coords.pop(gl.dim, None))
        if labels is None and k == 0 and feature_names is not None:
            labels = feature_names
        if labels is None:
            labels = np.arange(gl.gate.num_gates)
        labels = np.asarray(list(labels))
        if labels.shape != (gl.gate.num_gates,):
            raise ValueError(
                f"layer {gl.name!r} has {gl.gate.num_gates} gates but {labels.shape[0]} coordinate labels were given"
            )
        out[gl.dim] = labels
    if coords:
        raise ValueError(f"coords name unknown layers {sorted(coords)}; gated layers are {[g.name for g in layers]}")
    return out


def _weight_draws(gl, z):
    """Gated weights for draws ``z`` of shape ``(S, G)``: ``(S, *weight dims)`` and the dim names."""
    from ..nn.layers import L0Conv2d, L0Linear

    layer, clean = gl.layer, _sanitize(gl.name)
    if isinstance(layer, L0Linear):
        w = layer.weight.detach().to(z)
        return w.unsqueeze(0) * z.unsqueeze(1), [f"{clean}_out", gl.dim]
    if isinstance(layer, L0Conv2d):
        w = layer.weight.detach().to(z)
        return w.unsqueeze(0) * z[:, :, None, None, None], [gl.dim, f"{clean}_in", f"{clean}_kh", f"{clean}_kw"]
    raise TypeError(f"weights=True supports L0Linear and L0Conv2d layers; {gl.name!r} is {type(layer).__name__}")


# The table of argument checks of to_inference_data.
ARG_CHECKS = {"num_draws": COUNT, "seed": SEED}


@under_thread_policy
@torch.no_grad()
def to_inference_data(model, num_draws=1000, feature_names=None, coords=None, weights=False, seed=0):
    r"""Draw gates (and optionally weights) from the trained guide into an :class:`arviz.InferenceData`.

    :param model: a trained model (see :func:`gate_layers`).
    :param int num_draws: number of independent draws, stored as one chain (module docstring).
    :param feature_names: labels of the first gated layer's gates (e.g. the diabetes feature
        names for a regression); shorthand for ``coords={first layer: feature_names}``.
    :param dict coords: ``{layer name or gate dim: labels}`` for any layer; default ``0 .. G-1``
        (for an MLP input layer: the pixel index, row-major).
    :param bool weights: also draw the gated coefficients :math:`\tilde\theta \odot z` (memory:
        ``num_draws`` times the layer's weight count).
    :param int seed: seed of the draws (made on the CPU; torch's global CPU RNG state is restored after).
    :returns: :class:`arviz.InferenceData` with groups ``posterior`` and ``gates`` (module docstring).

    Runs under :func:`~l0bayes.threads.thread_policy` (one intra-op thread unless you chose otherwise).
    """
    az = import_arviz()
    import xarray as xr

    check_args("to_inference_data", ARG_CHECKS, num_draws=num_draws, seed=seed)
    total, seed = whole(num_draws), whole(seed)
    layers = gate_layers(model)
    dim_coords = _layer_coords(layers, coords, feature_names)
    posterior, dims, stats = {}, {}, {}
    attrs = {"layers": ",".join(gl.name for gl in layers), "model": type(model).__name__}
    rng_state = torch.get_rng_state()
    torch.manual_seed(seed)
    try:
        for gl in layers:
            g = gl.gate  # float64 on the CPU: exact gate quantities whatever the model's dtype and device
            q = HardConcrete(g.log_alpha.detach().double().cpu(), g.temperature, g.lower, g.upper)
            z = q.rsample((total,))
            posterior[gl.var] = z.reshape(1, total, -1).numpy()
            dims[gl.var] = [gl.dim]
            if weights:
                if gl.name == "z":
                    theta = model.weight.detach().double().cpu()
                    if getattr(model, "slab", "point") == "gaussian":
                        noise = torch.randn(total, theta.shape[0], dtype=theta.dtype)
                        theta = theta + model.slab_log_scale.detach().double().cpu().exp() * noise
                    w, wdims, wname = theta * z, [gl.dim], "theta"
                else:
                    w, wdims = _weight_draws(gl, z)
                    wname = f"w_{_sanitize(gl.name)}"
                posterior[wname] = w.reshape(1, total, *w.shape[1:]).numpy()
                dims[wname] = wdims
            for key, value in (
                ("log_alpha", q.log_alpha),
                ("prob_nonzero", q.prob_nonzero),
                ("prob_zero", q.prob_zero),
                ("prob_one", q.prob_one),
                ("mean", q.mean),
                ("test_gate", q.deterministic_gate),
            ):
                stats[f"{gl.var}_{key}"] = ((gl.dim,), value.numpy())
            attrs[f"{gl.var}_group_size"] = gl.gate.group_size
            attrs[f"{gl.var}_layer"] = gl.name
    finally:
        torch.set_rng_state(rng_state)
    idata = az.from_dict(posterior=posterior, dims=dims, coords=dict(dim_coords))
    gate_coords = {gl.dim: dim_coords[gl.dim] for gl in layers}
    idata.add_groups({"gates": xr.Dataset(stats, coords=gate_coords, attrs=attrs)})
    return idata


def gate_variables(idata):
    """The posterior gate variables of ``idata`` (``"z"`` / ``"z_<layer>"``), in layer order."""
    if "gates" not in idata.groups():
        raise ValueError("idata has no 'gates' group; build it with l0bayes.analysis.to_inference_data")
    layers = idata.gates.attrs["layers"].split(",")
    return [gate_var(name) for name in layers]
