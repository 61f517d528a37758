"""Per-epoch test error, first-layer open gates and expected FLOPs of several runs, side by side.

Reads the ``history.json`` of ``l0bayes fit`` / ``experiments/paper.py`` runs (a list of records) and of
``experiments/mlp_variants.py`` runs (``[epoch, test_error, open gates per layer, expected FLOPs]`` rows).

Example::

    python experiments/compare_runs.py --figure benchmarks/figures/mlp_protocol.png \\
        "plain=runs/paper-cpu-mlp/mlp/history.json" "protocol=runs/paper-protocol/mlp/history.json"
"""

import argparse
import json
import os


def load_history(path):
    """``(epochs, test errors, open gates per layer or None, expected FLOPs or None)`` of one run."""
    with open(path) as f:
        rows = json.load(f)
    if not rows:
        raise ValueError(f"{path}: empty history")
    if isinstance(rows[0], dict):
        epochs = [r["epoch"] for r in rows]
        errors = [r["test_error"] for r in rows]
        gates = [r.get("active_gates") for r in rows]
        flops = [r.get("expected_flops") for r in rows]
    else:
        epochs, errors = [r[0] for r in rows], [r[1] for r in rows]
        gates = [r[2] if len(r) > 2 else None for r in rows]
        flops = [r[3] if len(r) > 3 else None for r in rows]
    return epochs, errors, gates, flops


def plot(runs, path, title=None):
    """One figure, three panels; ``runs`` maps a label to a history path. Returns the figure path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.2))
    for k, (label, history) in enumerate(runs.items()):
        epochs, errors, gates, flops = load_history(history)
        style = {"color": f"C{k}", "label": label, "linewidth": 1.2, "linestyle": "--" if "dense" in label else "-"}
        axes[0].plot(epochs, [100 * e for e in errors], **style)
        if all(g is not None for g in gates):
            axes[1].plot(epochs, [g[0] for g in gates], **style)
        if all(v is not None for v in flops):
            axes[2].plot(epochs, flops, **style)
    axes[0].set_ylabel("test error (%)")
    axes[0].set_ylim(9, 13)
    axes[1].set_ylabel("open input neurons of fc1 (Eq. 13)")
    axes[2].set_ylabel("expected FLOPs per example (Fig. 3)")
    for ax in axes:
        ax.set_xlabel("epoch")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", metavar="LABEL=HISTORY", help="a label and the path of its history.json")
    parser.add_argument("--figure", required=True, help="PNG to write")
    parser.add_argument("--title", default=None)
    args = parser.parse_args(argv)
    runs = {}
    for item in args.runs:
        label, sep, path = item.partition("=")
        if not sep or not os.path.isfile(path):
            parser.error(f"expected LABEL=PATH with an existing file, got {item!r}")
        runs[label] = path
    print(plot(runs, args.figure, args.title))


if __name__ == "__main__":
    main()
