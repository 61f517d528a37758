"""The plots of a run: ``training.png`` (per epoch) and ``gates.png`` (q(z != 0) of every gate).

``training.png`` has the validation curve (the test metric per epoch without a validation split), with the
final model's test metric as a point at the epoch it kept (with ``--keep-best`` a dotted line marks that epoch),
and the expected FLOPs (with the dense network's FLOPs as a reference line), and for a constrained run a third
panel: the expected and the test-time density against the target. ``gates.png`` marks q(z != 0) = 0.5, the
median-probability model's threshold; for a Bayes regression its bars are the checked inclusion probabilities
(the table's headline), hatched where a failed check capped them at 0.9, with the trained gates' q(z != 0) as
points. Layers are named as in ``--lam`` (``fc1``, not the model's attribute path ``net.fc1``).

matplotlib (Agg backend) is imported here only; without it :func:`write_plots` returns ``None`` and the
command says that the plots were skipped.
"""

# (history key, axis label, scale) of the per-epoch panels, in order of preference: the history holds the
# validation metric when the run had a validation split, else the test metric
TEST_METRICS = (
    ("validation_error", "validation error (%)", 100.0),
    ("validation_rmse", "validation RMSE (standardised y)", 1.0),
    ("test_error", "test error (%)", 100.0),
    ("test_rmse", "test RMSE (standardised y)", 1.0),
)
OTHER_PANELS = (
    ("expected_flops", "expected FLOPs", 1.0),
    ("expected_l0", "expected L0 (Eq. 16)", 1.0),
    ("free_energy", "objective (nats)", 1.0),
)
#: the extra panel of a constrained run: its history records the expected density per constraint
DENSITY_PANEL = ("constraint", "density of the gated parameters", 1.0)
#: q(z != 0) above which a gate is in the median-probability model
MEDIAN_MODEL = 0.5


def _recorded(history, key):
    return any(r.get(key) is not None for r in history)


def training_panels(history, final_metric=None):
    """The panels of ``training.png`` as ``(key, label, scale)``, never one without values.

    The first is the per-epoch validation metric, or test metric without a validation split (error, or RMSE
    for a regression when the history records it);
    when the history has none and ``final_metric`` = ``(name, value)`` is given (a regression, whose
    per-epoch records hold no test metric), the first panel is ``("final", name, value)``: the final
    model's test metric, drawn at the last epoch. The second is the first recorded of expected FLOPs,
    expected L0 and the objective. A constrained run (its history records ``"constraint"``) adds
    :data:`DENSITY_PANEL`.
    """
    panels = [p for p in TEST_METRICS if _recorded(history, p[0])][:1]
    if not panels and final_metric is not None:
        panels = [("final", *final_metric)]
    panels += [p for p in OTHER_PANELS if _recorded(history, p[0])]
    panels = panels[:2]
    if _recorded(history, DENSITY_PANEL[0]):
        panels.append(DENSITY_PANEL)
    return panels


def layer_labels(names):
    """Short names of gated layers for legends: ``"net.fc1.gate"`` -> ``"fc1"``.

    The ``.gate`` suffix goes, and so do the leading components that every name shares (the
    attribute holding the network, e.g. ``net.``), keeping at least the last component of each.
    """
    parts = [[p for p in name.split(".") if p] for name in names]
    parts = [p[:-1] if len(p) > 1 and p[-1] == "gate" else p for p in parts]
    common = 0
    while parts and all(len(p) > common + 1 for p in parts) and len({p[common] for p in parts}) == 1:
        common += 1
    return [".".join(p[common:]) or "gates" for p in parts]


def _import_pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def write_plots(
    history,
    model,
    run,
    title,
    feature_names=None,
    final_metric=None,
    dense_flops=None,
    kept_epoch=None,
    inclusion_check=None,
):
    """Write ``training.png`` and ``gates.png`` into the run directory ``run``.

    :param feature_names: names of the inputs of a model with one gate per feature (the regressions):
        ``gates.png`` is then a bar per named feature instead of a sorted curve per layer.
    :param final_metric: ``(name, value)`` of the final model's test metric: a point beside the validation
        curve, or the panel itself when the history has no per-epoch metric (see :func:`training_panels`).
    :param dense_flops: FLOPs per example of the dense network, drawn as a reference line in the
        expected-FLOPs panel.
    :param kept_epoch: the epoch whose parameters the run kept (``--keep-best``), marked on the first panel;
        ``None``: the last.
    :param inclusion_check: a Bayes regression's check (:func:`~l0bayes.cli.inclusion.check_inclusion`): its
        checked probabilities are ``gates.png``'s bars.
    :returns: the names written, or ``None`` when matplotlib is not installed.
    """
    plt = _import_pyplot()
    if plt is None:
        return None
    written = []
    panels = training_panels(history, final_metric)
    if panels and history:
        _training_figure(plt, history, panels, run, title, dense_flops, final_metric, kept_epoch)
        written.append("training.png")
    from ..nn import gates_of

    gates = gates_of(model)
    if gates:
        if feature_names is not None and len(gates) == 1:
            _feature_gates_figure(plt, gates[0][1], feature_names, run, title, inclusion_check)
        else:
            _layer_gates_figure(plt, gates, run, title)
        written.append("gates.png")
    return written


def _training_figure(plt, history, panels, run, title, dense_flops=None, final_metric=None, kept_epoch=None):
    epochs = [r["epoch"] for r in history]
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.6), squeeze=False)
    for ax, (key, label, scale) in zip(axes[0], panels, strict=True):
        if key == "final":
            ax.plot([epochs[-1]], [scale], marker="o", linestyle="none")
            ax.annotate(f"{scale:.4f}", (epochs[-1], scale), textcoords="offset points", xytext=(-10, 8))
            ax.set_xlim(0.5, epochs[-1] + 0.5)
            label = f"{label}, final model"
        elif key == DENSITY_PANEL[0]:
            _density_panel(ax, history, epochs)
        else:
            values = [float("nan") if r.get(key) is None else scale * r[key] for r in history]
            curve = "validation, per epoch" if key.startswith("validation_") else label
            ax.plot(epochs, values, marker="o" if len(epochs) < 30 else None, label=curve)
            if key.startswith("validation_"):
                _test_point(ax, key, scale, final_metric, kept_epoch or epochs[-1], kept_epoch is not None)
            if key == "expected_flops" and dense_flops is not None:
                ax.axhline(dense_flops, color="0.35", ls="--", lw=1, label=f"dense network ({dense_flops:,.0f})")
                ax.legend(fontsize=8)
        ax.set_xlabel("epoch")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    run.write_figure("training.png", fig)
    plt.close(fig)


def _test_point(ax, key, scale, final_metric, epoch, chosen):
    """Beside the validation curve: the final model's test metric, at the epoch whose parameters it has; a dotted
    line marks an epoch chosen on the validation split (``--keep-best``)."""
    if chosen:
        ax.axvline(epoch, color="0.35", ls=":", lw=1, label=f"epoch kept (--keep-best): {epoch}")
    name, value = final_metric if final_metric is not None else (None, None)
    if value is not None and ("error" in name) == key.endswith("_error"):
        shown = f"{scale * value:.2f}%" if key.endswith("_error") else f"{value:.4f}"
        ax.plot([epoch], [scale * value], marker="*", ms=11, ls="none", color="C3", label=f"test, final model: {shown}")
    ax.legend(fontsize=8)


def _density_panel(ax, history, epochs):
    """A constrained run: expected density (Eq. 12) and test-time density (Eq. 13) against the target.

    One colour per constraint (per layer with ``--per-layer``); the line style says which density.
    """
    from matplotlib.lines import Line2D

    records = [r for r in history if r.get(DENSITY_PANEL[0]) is not None]
    first = records[0]
    count = len(first["constraint"])
    flops = "target_flops" in first  # the constraint is on FLOPs: draw the pruned model's FLOP fraction
    targets = first["target_flops"] if flops else first["target_density"]
    targets = [float(t) for t in targets] if isinstance(targets, list | tuple) else [float(targets)] * count
    key = "test_time_flops" if flops else "test_time_density"
    per_layer = list(first.get(f"{key}_per_layer") or {})
    per_layer = per_layer if count > 1 and len(per_layer) == count else None
    x = [r["epoch"] for r in records]
    one_target = len(set(targets)) == 1
    handles = []
    for k in range(count):
        colour = f"C{k}" if count > 1 else "C0"
        if per_layer:
            test_time = [r[f"{key}_per_layer"][per_layer[k]] for r in records]
        else:
            test_time = [r.get(key) for r in records]
        ax.plot(x, [r["constraint"][k] for r in records], color=colour)
        ax.plot(x, [float("nan") if v is None else v for v in test_time], color=colour, ls=":")
        if not one_target:
            ax.axhline(targets[k], color=colour, ls="--", lw=1)
    if one_target:
        ax.axhline(targets[0], color="0.2", ls="--", lw=1)
    if per_layer:
        handles += [Line2D([], [], color=f"C{k}", label=name) for k, name in enumerate(layer_labels(per_layer))]
    style = "C0" if count == 1 else "0.3"
    handles += [
        Line2D([], [], color=style, label="expected (Eq. 12)"),
        Line2D([], [], color=style, ls=":", label="test time (Eq. 13)"),
        Line2D([], [], color="0.2" if one_target else "0.3", ls="--", lw=1, label=_target_text(targets, one_target)),
    ]
    ax.set_xlim(epochs[0] - 0.5, epochs[-1] + 0.5)
    ax.set_ylim(0, 1.02)
    ax.legend(handles=handles, fontsize=7 if count > 1 else 8, ncol=2 if count > 1 else 1, loc="upper right")


def _target_text(targets, one_target):
    return f"target {targets[0]:g}" if one_target else "targets " + ", ".join(f"{t:g}" for t in targets)


def _layer_gates_figure(plt, gates, run, title):
    import torch

    fig, ax = plt.subplots(figsize=(6, 3.6))
    labels = layer_labels([name for name, _ in gates])
    with torch.no_grad():
        for label, (_, gate) in zip(labels, gates, strict=True):
            q = gate.prob_nonzero().detach().cpu().sort(descending=True).values
            frac = (torch.arange(q.numel()) + 0.5) / q.numel()
            ax.plot(frac.numpy(), q.numpy(), label=f"{label} ({q.numel()})")
    ax.axhline(MEDIAN_MODEL, color="0.35", ls="--", lw=1, label="0.5: median-probability model")
    ax.set_xlabel("gates of the layer, sorted (fraction)")
    ax.set_ylabel("q(z != 0)  (Eq. 12)")
    ax.set_ylim(-0.02, 1.02)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    run.write_figure("gates.png", fig)
    plt.close(fig)


def _feature_gates_figure(plt, gate, feature_names, run, title, check=None):
    """One bar per feature, labelled with its name, in the data set's order: the gates' q(z != 0), or for a Bayes
    regression (``check``) the checked inclusion probabilities, with the gates' as points."""
    import torch
    from matplotlib.patches import Patch

    with torch.no_grad():
        q = gate.prob_nonzero().detach().cpu().flatten().tolist()
    fig, ax = plt.subplots(figsize=(max(6, 0.32 * len(q) + 1.5), 3.8))
    x = range(len(q))
    if check is None:
        ax.bar(x, q)
        ax.set_ylabel("q(z != 0)  (Eq. 12)")
    else:
        status = check["status"]
        colours = ["0.6" if s == "unchecked" else "C1" if s == "capped" else "C0" for s in status]
        ax.bar(x, check["checked"], color=colours, hatch=["//" if s == "capped" else "" for s in status])
        ax.plot(x, q, ls="none", marker="o", ms=4, color="k", label="trained gate q(z != 0)")
        ax.set_ylabel("inclusion probability")
        handles = [Patch(color="C0", label=f"checked ({check['method']})")] if check["reliable"] else []
        if not check["reliable"]:
            handles.append(Patch(color="0.6", label="unchecked: the check failed"))
        if "capped" in status:
            handles.append(Patch(facecolor="C1", hatch="//", label="capped at 0.9: the check failed above it"))
        ax.add_artist(ax.legend(handles=handles, fontsize=8, loc="upper right"))
    ax.axhline(MEDIAN_MODEL, color="0.35", ls="--", lw=1, label="0.5: median-probability model")
    ax.set_xticks(list(x))
    ax.set_xticklabels(feature_names, rotation=60 if len(q) > 10 else 0, ha="right" if len(q) > 10 else "center")
    ax.set_ylim(0, 1.2 if check is None else 1.35)  # room for the legends above bars that reach 1
    ax.set_yticks([0, 0.2, 0.4, 0.6, 0.8, 1.0])
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(alpha=0.3, axis="y")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    run.write_figure("gates.png", fig)
    plt.close(fig)
