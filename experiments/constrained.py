"""Constrained sparsity against its targets: test-time density, error and architecture per run.

Trains the gated MLP (or LeNet-5) with ``objective="constrained"`` for each target (model-wise, or one per
layer with ``--per-layer``) and, for comparison, with the penalised objective for each ``--lam``; every run
writes ``OUT/<name>.json``: its settings, the per-epoch history and the final numbers (test error of the
pruned network, test-time density overall and per layer, architecture, remaining fraction of parameters).
A run whose file exists is skipped (so the script continues where it stopped); ``--summarize-only`` prints
the markdown table of everything in ``OUT`` and ``--figure`` draws density and error per epoch.

Examples::

    python experiments/constrained.py --data digits --targets 0.5 0.3 --lam 0.1 0.5 --seeds 0 1 2 --out runs/c-digits
    python experiments/constrained.py --data digits --targets 0.3 --per-layer --out runs/c-digits
    python experiments/constrained.py --data fashion-mnist --targets 0.5 0.33 0.1 --epochs 10 --out runs/c-fmnist
    python experiments/constrained.py --variant final_phase=0 --data digits --targets 0.3 --out runs/c-ablation
"""

import argparse
import json
import os
import time

import torch

from l0bayes.data import load_dataset
from l0bayes.inference import constrained_summary, train
from l0bayes.models import SparseClassifier
from l0bayes.nn import L0MLP, L0LeNet5
from l0bayes.nn.density import test_time_density
from l0bayes.pruning import PruneReport


def build(model, data, seed):
    torch.manual_seed(seed)
    if model == "mlp":
        hidden = (300, 100) if data.num_features == 784 else (100, 50)
        net = L0MLP(in_features=data.num_features, hidden=hidden, num_classes=data.num_classes)
    else:
        channels, height, width = data.input_shape
        net = L0LeNet5(
            in_channels=channels,
            num_classes=data.num_classes,
            input_size=(height, width),
            padding=0 if min(height, width) >= 28 else 2,
        )
    return net


def error(net, x, y):
    net.eval()
    with torch.no_grad():
        wrong = sum(int((net(x[i : i + 1000]).argmax(-1) != y[i : i + 1000]).sum()) for i in range(0, len(x), 1000))
    return wrong / len(x)


def run_one(args, data, name, seed, objective, target=None, lam=0.1, variant=None):
    path = os.path.join(args.out, f"{name}.json")
    if os.path.exists(path):
        print(f"{name}: exists, skipped", flush=True)
        return
    net = build(args.model, data, seed)
    model = SparseClassifier(net, lam=lam)
    kwargs = dict(variant or {})
    if objective == "constrained":
        kwargs.update(target_density=target, per_layer=args.per_layer)
    start = time.perf_counter()
    result = train(
        model,
        data.x_train,
        data.y_train,
        objective=objective,
        epochs=args.epochs,
        batch_size=100,
        lr=args.lr,
        seed=seed,
        test_data=(data.x_test, data.y_test),
        progress=False,
        threads=None,  # the count of --threads
        **kwargs,
    )
    wall = time.perf_counter() - start
    report = PruneReport.from_model(net, data.input_shape)
    final = {
        "test_error": error(report.pruned, data.x_test, data.y_test),
        "test_time_density": test_time_density(net),
        "test_time_density_per_layer": test_time_density(net, per_layer=True),
        "architecture": report.architecture,
        "remaining_parameters": report.params_pruned / report.params_dense,
        "wall_s": wall,
    }
    if objective == "constrained":
        final.update(constrained_summary(result, target, per_layer=args.per_layer))  # with the final-phase check
    settings = {
        "data": args.data,
        "model": args.model,
        "objective": objective,
        "target": target,
        "per_layer": args.per_layer,
        "lam": lam,
        "seed": seed,
        "epochs": args.epochs,
        "lr": args.lr,
        "variant": variant or {},
    }
    with open(path + ".tmp", "w") as f:
        json.dump({"settings": settings, "final": final, "history": result.history}, f, indent=1)
    os.replace(path + ".tmp", path)
    print(
        f"{name}: error {100 * final['test_error']:.2f}%, test-time density {final['test_time_density']:.3f}, "
        f"{final['architecture']}, {wall:.0f} s",
        flush=True,
    )


def parse_variant(text):
    out = {}
    for item in text.split(","):
        key, value = item.split("=")
        out[key] = {"true": True, "false": False}.get(value.lower(), None)
        if out[key] is None:
            out[key] = float(value)
    return out


def summarize(out):
    rows = []
    for file in sorted(os.listdir(out)):
        if not file.endswith(".json"):
            continue
        with open(os.path.join(out, file)) as f:
            run = json.load(f)
        s, r = run["settings"], run["final"]
        layers = "/".join(f"{v:.3f}" for v in r["test_time_density_per_layer"].values())
        target = s["target"] if s["objective"] == "constrained" else f"lam {s['lam']}"
        rows.append(
            f"| {file[:-5]} | {target} | {s['seed']} | {100 * r['test_error']:.2f} | {r['test_time_density']:.3f} "
            f"| {layers} | {r['architecture']} | {r['remaining_parameters']:.3f} | {s['epochs']} |"
        )
    head = (
        "| run | target | seed | test error % | test-time density | per layer | architecture | remaining params"
        " | epochs |\n|---|---|---|---|---|---|---|---|---|"
    )
    print("\n".join([head, *rows]))


def figure(out, path, names):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_d, ax_e) = plt.subplots(1, 2, figsize=(11, 4))
    for i, name in enumerate(names):
        with open(os.path.join(out, f"{name}.json")) as f:
            run = json.load(f)
        hist, s = run["history"], run["settings"]
        epochs = [h["epoch"] for h in hist]
        color = f"C{i}"
        if s["objective"] == "constrained":
            label = name
            ax_d.plot(epochs, [h["test_time_density"] for h in hist], color=color, label=f"{label}: test-time")
            ax_d.plot(epochs, [h["constraint"][0] for h in hist], color=color, ls=":", label=f"{label}: expected")
            for t in [s["target"]] if not isinstance(s["target"], list) else s["target"]:
                ax_d.axhline(t, color=color, lw=0.6, ls="--")
        else:
            label = f"{name} (penalised)"
        full = [h for h in hist if "test_error" in h]
        ax_e.plot([h["epoch"] for h in full], [100 * h["test_error"] for h in full], color=color, label=label)
    ax_d.set(xlabel="epoch", ylabel="density (fraction of gated parameters)", title="density vs target (dashed)")
    ax_e.set(xlabel="epoch", ylabel="test error (%)", title="test error (Eq. 13 gates)", yscale="log")
    ax_d.legend(fontsize=7)
    ax_e.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="digits")
    parser.add_argument("--model", choices=("mlp", "lenet5"), default="mlp")
    parser.add_argument("--targets", type=float, nargs="*", default=[])
    parser.add_argument("--per-layer", action="store_true")
    parser.add_argument("--lam", type=float, nargs="*", default=[], help="penalised runs to compare (lambda * N)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--epochs", type=int, default=None)
    parser.add_argument("--lr", type=float, default=None)
    parser.add_argument("--variant", type=parse_variant, default=None, help="train() options, e.g. final_phase=0")
    parser.add_argument("--tag", default="")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", required=True)
    parser.add_argument("--summarize-only", action="store_true")
    parser.add_argument("--figure", nargs="*", default=None, help="run names to draw (into OUT/figure.png)")
    args = parser.parse_args(argv)
    if args.summarize_only or args.figure:
        if args.figure:
            figure(args.out, os.path.join(args.out, "figure.png"), args.figure)
        summarize(args.out)
        return
    torch.set_num_threads(args.threads)
    bundled = args.data in ("digits",)
    args.epochs = args.epochs or (100 if bundled else 10)
    args.lr = args.lr or (1e-2 if bundled else 1e-3)
    os.makedirs(args.out, exist_ok=True)
    data = load_dataset(args.data, seed=0)
    kind = "layer" if args.per_layer else "model"
    for seed in args.seeds:
        for target in args.targets:
            name = f"{args.model}-c{kind}{target:g}{args.tag}-s{seed}"
            run_one(args, data, name, seed, "constrained", target=target, variant=args.variant)
        for lam in args.lam:
            run_one(args, data, f"{args.model}-lam{lam:g}{args.tag}-s{seed}", seed, "penalized", lam=lam)


if __name__ == "__main__":
    main()
