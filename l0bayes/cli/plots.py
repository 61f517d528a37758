"""The plots of a run: ``training.png`` (per epoch) and ``gates.png`` (q(z != 0) of every gate).

matplotlib (Agg backend) is imported here only; without it :func:`write_plots` returns ``None`` and the
command says that the plots were skipped.
"""

# (history key, axis label, scale) of the per-epoch panels, in order of preference
TEST_METRICS = (("test_error", "test error (%)", 100.0), ("test_rmse", "test RMSE (standardised y)", 1.0))
OTHER_PANELS = (
    ("expected_flops", "expected FLOPs", 1.0),
    ("expected_l0", "expected L0 (Eq. 16)", 1.0),
    ("free_energy", "objective (nats)", 1.0),
)


def _recorded(history, key):
    return any(r.get(key) is not None for r in history)


def training_panels(history, final_metric=None):
    """The two panels of ``training.png`` as ``(key, label, scale)``, never one without values.

    The first is the per-epoch test metric (error, or RMSE for a regression when the history records it);
    when the history has none and ``final_metric`` = ``(name, value)`` is given (a regression, whose
    per-epoch records hold no test metric), the first panel is ``("final", name, value)``: the final
    model's test metric, drawn at the last epoch.
    """
    panels = [p for p in TEST_METRICS if _recorded(history, p[0])][:1]
    if not panels and final_metric is not None:
        panels = [("final", *final_metric)]
    panels += [p for p in OTHER_PANELS if _recorded(history, p[0])]
    return panels[:2]


def _import_pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def write_plots(history, model, run, title, feature_names=None, final_metric=None):
    """Write ``training.png`` and ``gates.png`` into the run directory ``run``.

    :param feature_names: names of the inputs of a model with one gate per feature (the regressions):
        ``gates.png`` is then a bar per named feature instead of a sorted curve per layer.
    :param final_metric: ``(name, value)`` of the final model, plotted when the history has no per-epoch
        test metric (see :func:`training_panels`).
    :returns: the names written, or ``None`` when matplotlib is not installed.
    """
    plt = _import_pyplot()
    if plt is None:
        return None
    written = []
    panels = training_panels(history, final_metric)
    if panels and history:
        _training_figure(plt, history, panels, run, title)
        written.append("training.png")
    from ..nn import gates_of

    gates = gates_of(model)
    if gates:
        if feature_names is not None and len(gates) == 1:
            _feature_gates_figure(plt, gates[0][1], feature_names, run, title)
        else:
            _layer_gates_figure(plt, gates, run, title)
        written.append("gates.png")
    return written


def _training_figure(plt, history, panels, run, title):
    epochs = [r["epoch"] for r in history]
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.6), squeeze=False)
    for ax, (key, label, scale) in zip(axes[0], panels, strict=True):
        if key == "final":
            ax.plot([epochs[-1]], [scale], marker="o", linestyle="none")
            ax.annotate(f"{scale:.4f}", (epochs[-1], scale), textcoords="offset points", xytext=(-10, 8))
            ax.set_xlim(0.5, epochs[-1] + 0.5)
            label = f"{label}, final model"
        else:
            values = [float("nan") if r.get(key) is None else scale * r[key] for r in history]
            ax.plot(epochs, values, marker="o" if len(epochs) < 30 else None)
        ax.set_xlabel("epoch")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    run.write_figure("training.png", fig)
    plt.close(fig)


def _layer_gates_figure(plt, gates, run, title):
    import torch

    fig, ax = plt.subplots(figsize=(6, 3.6))
    with torch.no_grad():
        for name, gate in gates:
            q = gate.prob_nonzero().detach().cpu().sort(descending=True).values
            frac = (torch.arange(q.numel()) + 0.5) / q.numel()
            ax.plot(frac.numpy(), q.numpy(), label=f"{name.removesuffix('.gate') or 'gates'} ({q.numel()})")
    ax.set_xlabel("gates of the layer, sorted (fraction)")
    ax.set_ylabel("q(z != 0)  (Eq. 12)")
    ax.set_ylim(-0.02, 1.02)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    run.write_figure("gates.png", fig)
    plt.close(fig)


def _feature_gates_figure(plt, gate, feature_names, run, title):
    """One bar per feature, labelled with its name, in the data set's order."""
    import torch

    with torch.no_grad():
        q = gate.prob_nonzero().detach().cpu().flatten().tolist()
    fig, ax = plt.subplots(figsize=(max(6, 0.32 * len(q) + 1.5), 3.8))
    ax.bar(range(len(q)), q)
    ax.set_xticks(range(len(q)))
    ax.set_xticklabels(feature_names, rotation=60 if len(q) > 10 else 0, ha="right" if len(q) > 10 else "center")
    ax.set_ylabel("q(z != 0)  (Eq. 12)")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3, axis="y")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    run.write_figure("gates.png", fig)
    plt.close(fig)
