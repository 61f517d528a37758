"""What a constrained run achieved in the pruned model, against its target: a summary and the rows of a table."""

import torch

from ...nn.density import density_names, test_time_gate_density
from ...pruning.size import network_size
from .constrained import measure_name
from .final_phase import largest_gap

__all__ = ["constrained_rows", "constrained_summary"]


def constrained_summary(
    model,
    target_density=None,
    per_layer=False,
    multipliers=None,
    tolerance=0.02,
    density_at_final_phase=None,
    history=None,
    target_flops=None,
    input_shape=None,
):
    """What a constrained run achieved in the pruned model, and one-line warnings when it missed.

    :param model: the :class:`~l0bayes.inference.TrainResult` of the run (its model, multipliers and
        history are then used), or the trained network (or model) holding the gates.
    :param target_density, target_flops: the run's target (one of them): a fraction of the dense model's
        parameters or FLOPs per example.
    :param multipliers: the run's final multipliers (``TrainResult.multipliers``), copied into the summary.
    :param density_at_final_phase: the expected fraction when the gates were fixed (the history's
        ``density_at_final_phase``); by default read from the history. A warning says when it exceeded
        its target by more than ``FINAL_PHASE_GAP``.
    :param history: the run's history (``TrainResult.history``) when ``model`` is not a ``TrainResult``.
    :param input_shape: one example's shape, for the FLOP fraction (a model of
        :func:`~l0bayes.pruning.sparsify` knows its own).
    :returns: ``{"target_density" or "target_flops", "test_time_density", "test_time_density_per_layer",
        "test_time_flops" (when the input shape is known), "warnings"}`` (and ``"multipliers"`` when known):
        the target (a float, or ``{layer: target}`` with ``per_layer``); the fraction of the dense model's
        parameters that :func:`~l0bayes.pruning.prune` keeps (:func:`~l0bayes.pruning.test_time_density`),
        overall and of each gated layer's own (keyed by :func:`~l0bayes.nn.density.density_names`); the
        fraction of its FLOPs per example; and one-line warnings: a constraint more than ``tolerance`` off
        its target, a layer with no gate open, a final phase that started far above the target.
    """
    if not isinstance(model, torch.nn.Module) and hasattr(model, "history") and hasattr(model, "model"):
        history = model.history if history is None else history
        multipliers = model.multipliers if multipliers is None else multipliers
        model = model.model
    if (target_density is None) == (target_flops is None):
        raise ValueError("constrained_summary needs exactly one of target_density and target_flops")
    if density_at_final_phase is None and history:
        started = [r["density_at_final_phase"] for r in history if r.get("density_at_final_phase") is not None]
        density_at_final_phase = started[-1] if started else None
    names = density_names(model)
    size = network_size(model, input_shape)
    overall = size.fraction("parameters", "test")
    layers = size.fraction("parameters", "test", per_layer=True)
    flops = size.fraction("flops", "test") if size.calls is not None else None
    what = "parameters" if target_flops is None else "flops"
    if what == "flops" and flops is None:
        raise ValueError("a FLOP target needs input_shape: the shape of one example, without the batch dimension")
    target = target_density if target_flops is None else target_flops
    achieved_all = overall if what == "parameters" else flops
    achieved_layers = layers if what == "parameters" else size.fraction("flops", "test", per_layer=True)
    warnings = []
    if per_layer:
        targets = torch.as_tensor(target, dtype=torch.float64).reshape(-1).expand(len(names)).tolist()
        target_out = dict(zip(names, targets, strict=True))
        checks = [(f"layer {n}", achieved_layers[n], t) for n, t in target_out.items()]
    else:
        target_out = float(target)
        checks = [("network", achieved_all, target_out)]
    for where, achieved, t in checks:
        if abs(achieved - t) > tolerance:
            warnings.append(
                f"{where}: the pruned model keeps {achieved:.3f} of the {measure_name(what)}, more than {tolerance:g} "
                f"off its target {t:.3f}"
            )
    open_gates = test_time_gate_density(model, per_layer=True)
    warnings += [f"layer {n} ended empty: no gate is open at test time" for n, d in open_gates.items() if d == 0]
    if density_at_final_phase is not None:
        started = torch.as_tensor(density_at_final_phase, dtype=torch.float64).reshape(-1).tolist()
        far = largest_gap(started, [t for _, _, t in checks])
        if far is not None:
            d, t = far
            warnings.append(
                f"the final phase started at expected {measure_name(what)} {d:.3f} against the target {t:.3f}: "
                "more epochs or a larger multiplier_lr would let the Lagrangian get there first"
            )
    out = {
        ("target_density" if what == "parameters" else "target_flops"): target_out,
        "test_time_density": overall,
        "test_time_density_per_layer": layers,
        "warnings": warnings,
    }
    if flops is not None:
        out["test_time_flops"] = flops
    if multipliers is not None:
        out["multipliers"] = torch.as_tensor(multipliers).detach().cpu().tolist()
    return out


def constrained_rows(summary):
    """``(label, text)`` rows for a results table from :func:`constrained_summary`."""
    key = "target_density" if "target_density" in summary else "target_flops"
    target = summary[key]
    layers = summary["test_time_density_per_layer"]
    if isinstance(target, dict):
        target_text = ", ".join(f"{k} {v:.3g}" for k, v in target.items())
    else:
        target_text = f"{target:.3g}"
    rows = [
        ("target " + ("density (parameters)" if key == "target_density" else "FLOPs"), target_text),
        (
            "pruned model's parameters",
            f"{summary['test_time_density']:.4f} of dense  ("
            + ", ".join(f"{k} {v:.4f}" for k, v in layers.items())
            + ")",
        ),
    ]
    if "test_time_flops" in summary:
        rows.append(("pruned model's FLOPs", f"{summary['test_time_flops']:.4f} of dense"))
    if "multipliers" in summary:
        rows.append(("multipliers", ", ".join(f"{m:.4g}" for m in summary["multipliers"])))
    return rows
