"""The paper's MNIST experiments (Section 4.1, Table 1, Figure 3) on Fashion-MNIST or MNIST.

Runs, each into ``OUT/<name>/`` (the files of ``l0bayes fit``: history, checkpoint, pruned model,
plots, summary.json):

=================  ==================================================================================
``mlp``            L0 MLP 784-300-100, penalised (Eq. 22), lambda = 0.1/N
``mlp-sep``        the same with separate per-layer lambdas (:data:`MLP_SEP`)
``mlp-bayes``      L0 MLP, SVI on the free energy of Eq. 21 (analytic gate KL), lambda = 0.1/N
``mlp-dense``      plain MLP 784-300-100 with cross-entropy (baseline; same optimiser and epochs)
``lenet5``         L0 LeNet-5-Caffe 20-50-800-500, penalised, lambda = 0.1/N
``lenet5-sep``     the same with per-layer lambdas (:data:`LENET_SEP`)
``lenet5-bayes``   L0 LeNet-5-Caffe, SVI on Eq. 21
``lenet5-dense``   plain LeNet-5-Caffe (baseline)
=================  ==================================================================================

All runs: Adam lr 1e-3, minibatches of 100, no weight decay, pixels scaled to [0, 1], the official 60,000 /
10,000 split, seed 0, and three details of the paper's public code that matter for the final test error: He's
initialisation N(0, 2 / fan_in) with zero biases (``--init he``, for the dense baselines too), every gate's
``log_alpha`` projected onto ``[log 0.01, log 100]`` after each step (``--log-alpha-range``, ``l0bayes fit
--log-alpha-range paper``) and evaluation with the bias-corrected moving average of the parameters, decay
0.999 (``--ema``; the dense baselines are averaged alike; the paper's code averages its MLP, its LeNet-5
script does not, we average both). ``--init torch --ema 0 --log-alpha-range none`` gives torch.nn's
initialisation and the last iterate without projection. The L0 runs go through the command line (``python -m
l0bayes fit``, one subprocess each, so that every run is exactly reproducible from the printed command); the
dense baselines use the same data loader and a minimal Adam loop here. ``--epochs 200`` is the paper's
protocol (meant for a GPU, ``--device cuda``); on a CPU use a few epochs.

Examples::

    python experiments/paper.py --epochs 200 --device cuda --out runs/paper          # full protocol
    python experiments/paper.py --epochs 10 --runs mlp mlp-dense mlp-bayes --threads 1 # CPU, MLP only
    python experiments/paper.py --data mnist-dir --data-dir ~/mnist --epochs 200     # MNIST
    python experiments/paper.py --summarize-only --out runs/paper                    # table + figure

Afterwards :func:`summarize` prints a markdown table (test error, pruned architecture, parameters,
FLOPs, expected FLOPs, s/epoch) and writes a figure of the per-epoch history (test error, expected
FLOPs, architecture) of every run to ``--figure``.
"""

import argparse
import contextlib
import datetime
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time

# Per-layer lambdas (the paper's lambda times N, nats per active parameter). The paper gives the
# LeNet-5 values for the convolutions (10/N for conv1 and 0.5/N for conv2, Section 4.1); the values
# of the fully connected layers and of the MLP are not given there and are our choice: a larger
# lambda for the layers whose gates control fewer parameters, as the paper suggests.
MLP_SEP = "fc1=0.1,fc2=0.5,fc3=5"
LENET_SEP = "conv1=10,conv2=0.5,fc1=0.1,fc2=0.5"

RUNS = {
    "mlp": ["--model", "mlp", "--objective", "penalized", "--lam", "0.1"],
    "mlp-sep": ["--model", "mlp", "--objective", "penalized", "--lam", MLP_SEP],
    "mlp-bayes": ["--model", "mlp", "--objective", "bayes", "--lam", "0.1"],
    "mlp-dense": None,
    "lenet5": ["--model", "lenet5", "--objective", "penalized", "--lam", "0.1"],
    "lenet5-sep": ["--model", "lenet5", "--objective", "penalized", "--lam", LENET_SEP],
    "lenet5-bayes": ["--model", "lenet5", "--objective", "bayes", "--lam", "0.1"],
    "lenet5-dense": None,
}


def run_l0(name, args, out):
    """One L0 run through the command line, in a subprocess; returns the command."""
    command = [
        sys.executable,
        "-m",
        "l0bayes",
        "fit",
        *RUNS[name],
        "--data",
        args.data,
        "--epochs",
        str(args.epochs),
        "--batch-size",
        "100",
        "--lr",
        "1e-3",
        "--seed",
        str(args.seed),
        "--device",
        args.device,
        "--out",
        out,
        "--no-progress",
    ]
    if args.data_dir:
        command += ["--data-dir", args.data_dir]
    if args.ema > 0:
        command += ["--ema", str(args.ema)]
    if args.init != "torch":
        command += ["--init", args.init]
    if args.log_alpha_range != "none":
        command += ["--log-alpha-range", args.log_alpha_range]
    if args.threads:
        command += ["--threads", str(args.threads)]
    if args.cuda_graph:
        command += ["--cuda-graph"]
    if os.path.isfile(os.path.join(out, "checkpoint.pt")):
        command += ["--resume"]
    elif os.path.isdir(out) and os.listdir(out):  # started but no epoch finished: nothing to continue
        command += ["--overwrite"]
    print("$ " + shlex.join(command), flush=True)
    subprocess.run(command, check=True)
    return shlex.join(command)


def run_dense(name, args, out):
    """A dense baseline (plain MLP or LeNet-5) with the same data, optimiser, epochs and seed."""
    import torch
    import torch.nn.functional as F

    from l0bayes.data import load_dataset
    from l0bayes.inference import ParameterAverage
    from l0bayes.inference.device import resolve_device
    from l0bayes.nn import MLP, LeNet5
    from l0bayes.pruning import count_parameters, flops
    from l0bayes.pruning.export import save_pruned

    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    data = load_dataset(args.data, data_dir=args.data_dir, seed=args.seed)
    torch.manual_seed(args.seed)
    if name == "mlp-dense":
        net = MLP(784, (300, 100), 10, weight_init=args.init)
    else:
        net = LeNet5(1, 10, 28, weight_init=args.init)
    net = net.to(device)
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)
    average = ParameterAverage(net, args.ema) if args.ema > 0 else None
    shuffle = torch.Generator().manual_seed(args.seed)
    x, y, n = data.x_train, data.y_train, data.x_train.shape[0]
    forward = net
    if args.cuda_graph:  # as train(cuda_graph=True): the data on the GPU, forward and backward replayed as graphs
        x, y = x.to(device), y.to(device)
        with torch.random.fork_rng(devices=[device]):
            forward = torch.cuda.make_graphed_callables(net, (x[:100].clone(),))
    history = []
    for epoch in range(args.epochs):
        net.train()
        start = time.perf_counter()
        order = torch.randperm(n, generator=shuffle).to(x.device)
        for i in range(0, n, 100):
            idx = order[i : i + 100]
            optimizer.zero_grad(set_to_none=True)
            xb = x[idx].to(device)
            # (a smaller last minibatch cannot replay the graph: the class's own forward runs it)
            logits = forward(xb) if idx.numel() == 100 else type(net).forward(net, xb)
            loss = F.cross_entropy(logits, y[idx].to(device))
            loss.backward()
            optimizer.step()
            if average is not None:
                average.update()
        wall = time.perf_counter() - start
        net.eval()
        with torch.no_grad(), average.swapped() if average is not None else contextlib.nullcontext():
            wrong = sum(
                int((net(data.x_test[i : i + 1000].to(device)).argmax(-1).cpu() != data.y_test[i : i + 1000]).sum())
                for i in range(0, data.x_test.shape[0], 1000)
            )
        history.append({"epoch": epoch + 1, "test_error": wrong / data.x_test.shape[0], "wall_s": wall})
        print(f"{name} epoch {epoch + 1}: test error {100 * history[-1]['test_error']:.2f}%, {wall:.1f} s", flush=True)
    if average is not None:
        average.copy_to_model()
    net = net.cpu()
    fl = flops(net, (1, 28, 28))
    for record in history:
        record["expected_flops"] = float(fl)
    dense_arch = "784-300-100" if name == "mlp-dense" else "20-50-800-500"
    summary = {
        "metric": "test error",
        "test": history[-1]["test_error"],
        "architecture": dense_arch,
        "dense_architecture": dense_arch,
        "params_pruned": count_parameters(net),
        "params_dense": count_parameters(net),
        "flops_pruned": fl,
        "flops_dense": fl,
        "expected_flops": float(fl),
        "epochs": args.epochs,
        "device": f"{device}" + (f" ({torch.get_num_threads()} threads)" if device.type == "cpu" else ""),
    }
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "history.json"), "w") as f:
        json.dump(history, f, indent=1)
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    save_pruned(net, os.path.join(out, "dense.pt"), {"model": name, "architecture": dense_arch})
    return f"{shlex.join([sys.executable, *sys.argv])}  (dense baseline {name}, in-process)"


def _load(out, name):
    path = os.path.join(out, name)
    try:
        with open(os.path.join(path, "summary.json")) as f:
            summary = json.load(f)
        with open(os.path.join(path, "history.json")) as f:
            history = json.load(f)
    except FileNotFoundError:
        return None
    return summary, history


def summarize(out, names, figure=None):
    """A markdown table of the runs found under ``out``; a per-epoch figure if ``figure`` is given."""
    rows, found = [], {}
    head = (
        "run",
        "epochs",
        "test error",
        "lowest test error seen (epoch; no model is chosen by it)",
        "architecture",
        "params",
        "FLOPs",
        "expected FLOPs",
        "s/epoch (median)",
    )
    for name in names:
        loaded = _load(out, name)
        if loaded is None:
            continue
        summary, history = loaded
        found[name] = history
        errors = [(r["test_error"], r["epoch"]) for r in history if r.get("test_error") is not None]
        best = min(errors) if errors else (float("nan"), 0)
        per_epoch = statistics.median(r["wall_s"] for r in history) if history else float("nan")
        rows.append(
            (
                name,
                str(len(history)),
                f"{100 * summary['test']:.2f}%",
                f"{100 * best[0]:.2f}% ({best[1]})",
                summary["architecture"],
                f"{summary['params_pruned']:,} / {summary['params_dense']:,}",
                f"{summary['flops_pruned']:,} / {summary['flops_dense']:,}",
                f"{summary['expected_flops']:,.0f}",
                f"{per_epoch:.1f}",
            )
        )
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    table = "\n".join(lines)
    if figure and found:
        _figure(found, figure)
    return table


def _figure(found, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for k, (name, history) in enumerate(found.items()):
        epochs = [r["epoch"] for r in history]
        style = {"linestyle": "--" if name.endswith("dense") else "-", "marker": ".", "color": f"C{k}", "label": name}
        axes[0].plot(epochs, [100 * r["test_error"] for r in history], **style)
        if any("expected_flops" in r for r in history):
            axes[1].plot(epochs, [r.get("expected_flops", float("nan")) for r in history], **style)
        if any("active_gates" in r for r in history):
            axes[2].plot(epochs, [sum(r["active_gates"]) for r in history], **style)
    axes[0].set_ylabel("test error (%)")
    axes[1].set_ylabel("expected FLOPs per example (Fig. 3)")
    axes[1].set_yscale("log")
    axes[2].set_ylabel("open gates (Eq. 13), all layers")
    for ax in axes:
        ax.set_xlabel("epoch")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="fashion-mnist", choices=("fashion-mnist", "mnist-dir"))
    parser.add_argument("--data-dir", default=None, help="IDX directory (required for mnist-dir)")
    parser.add_argument("--epochs", type=int, default=200, help="200 is the paper's protocol")
    parser.add_argument("--runs", nargs="+", default=list(RUNS), choices=list(RUNS))
    parser.add_argument("--device", default="auto")
    parser.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: torch's default)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--ema", type=float, default=0.999, help="parameter-average decay used for evaluation (0: last iterate)"
    )
    parser.add_argument("--log-alpha-range", default="paper", help="LOW,HIGH, 'paper' ([log 0.01, log 100]) or 'none'")
    parser.add_argument(
        "--init",
        choices=("torch", "he"),
        default="he",
        help="weight initialisation of every run (l0bayes fit --init)",
    )
    parser.add_argument(
        "--cuda-graph",
        action="store_true",
        help="replay each step's forward and backward as CUDA graphs (l0bayes fit --cuda-graph; CUDA only)",
    )
    parser.add_argument("--out", default="runs/paper")
    parser.add_argument("--figure", default=None, help="PNG of the per-epoch histories (default OUT/history.png)")
    parser.add_argument("--summarize-only", action="store_true")
    args = parser.parse_args(argv)
    if args.data == "mnist-dir" and not args.data_dir:
        parser.error("--data mnist-dir needs --data-dir")
    commands = {}
    if not args.summarize_only:
        print(
            f"# {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, {platform.node()}, "
            f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
            flush=True,
        )
        for name in args.runs:
            out = os.path.join(args.out, name)
            start = time.perf_counter()
            commands[name] = (run_dense if RUNS[name] is None else run_l0)(name, args, out)
            print(f"# {name}: {time.perf_counter() - start:.0f} s", flush=True)
        path = os.path.join(args.out, "commands.json")
        if os.path.isfile(path):  # runs of other invocations into the same directory are kept
            with open(path) as f:
                commands = {**json.load(f), **commands}
        with open(path, "w") as f:
            json.dump(commands, f, indent=1)
    figure = args.figure or os.path.join(args.out, "history.png")
    print(summarize(args.out, args.runs, figure))
    print(f"figure: {figure}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
