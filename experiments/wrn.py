"""The paper's Wide ResNet experiment (Section 4.2, Fig. 4) on Fashion-MNIST padded to 32x32.

Runs, each in ``OUT/<run>/``:

* ``dense``: the dense :class:`~l0bayes.nn.WideResNet` (same optimiser, steps and data);
* ``penalized``: the L0 WRN (:func:`~l0bayes.pruning.l0_wide_resnet`, gates on the first convolution of
  every block, initial drop rate 0.3) trained with ``train(objective="penalized")`` and ``--lam``;
* ``constrained``: the same with ``train(objective=Constrained(target_density=--target))``.

Each L0 run records the expected FLOPs after every epoch (Fig. 4), prunes the trained model
(:func:`~l0bayes.pruning.prune`), checks the pruned model against the gated one and saves it with
``torch.export.save`` (``pruned.pt2``, loads without unpickling). ``OUT/summary.json`` and the printed
markdown table hold test errors, architectures and FLOPs; ``OUT/flops.png`` draws Fig. 4.

``--optimizer sgd`` is the paper's schedule: SGD with Nesterov momentum 0.9 at ``--lr`` (0.1 in the
paper), weight decay ``--weight-decay`` (5e-4) on the weights only, the gates at ``--gate-lr`` (default:
``--lr``) without weight decay, and the step size multiplied by ``--gamma`` (0.2) after each of
``--milestones`` (default: the paper's 60/120/160 of 200 epochs scaled to ``--epochs``). The dense
baseline gets the same optimiser and schedule. ``--optimizer adam`` is Adam at ``--lr`` for everything.
The paper's WRN-28-10 run (200 epochs, lambda 0.001) needs a GPU; on a CPU use WRN-16-4, a training
subset (``--train-size``) and few epochs::

    python experiments/wrn.py --depth 16 --width 4 --train-size 4000 --test-size 1000 --epochs 5 \\
        --optimizer sgd --lr 0.1 --threads 1 --out runs/wrn
"""

import argparse
import json
import pathlib
import sys
import time

import torch
import torch.nn.functional as F

from l0bayes.data import load_dataset
from l0bayes.inference import Constrained, ExpectedFlops, parameter_groups, train
from l0bayes.models import SparseClassifier
from l0bayes.nn import WideResNet, architecture
from l0bayes.pruning import expected_density, flops, l0_wide_resnet, prune, test_time_density

RUNS = ("dense", "penalized", "constrained")


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="output directory; OUT/<run> must not exist yet")
    p.add_argument("--summarize-only", action="store_true", help="table and figure of the runs found in OUT")
    p.add_argument("--runs", nargs="+", default=list(RUNS), choices=RUNS)
    p.add_argument("--data", default="fashion-mnist", help="a data set of l0bayes.data.load_dataset")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--depth", type=int, default=16)
    p.add_argument("--width", type=int, default=4)
    p.add_argument("--train-size", type=int, default=2000, help="training subset (0: all)")
    p.add_argument("--test-size", type=int, default=1000, help="test subset (0: all)")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=50)
    p.add_argument("--optimizer", choices=("adam", "sgd"), default="adam")
    p.add_argument("--lr", type=float, default=0.01, help="step size of the weights (and of the gates by default)")
    p.add_argument("--gate-lr", type=float, default=None, help="step size of the gates' log_alpha (default: --lr)")
    p.add_argument("--momentum", type=float, default=0.9, help="sgd: Nesterov momentum")
    p.add_argument("--weight-decay", type=float, default=5e-4, help="sgd: weight decay of the weights (not gates)")
    p.add_argument("--milestones", type=int, nargs="*", default=None, help="sgd: epochs after which lr *= gamma")
    p.add_argument("--gamma", type=float, default=0.2, help="sgd: factor of each drop")
    p.add_argument("--lam", type=float, default=0.001, help="penalised run: nats per active parameter")
    p.add_argument("--target", type=float, default=0.5, help="constrained run: target expected density")
    p.add_argument("--init-drop-rate", type=float, default=0.3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    return p.parse_args(argv)


def load(args):
    """Images padded from 28x28 to 32x32 (zeros), seeded subsets of train and test."""
    data = load_dataset(args.data, data_dir=args.data_dir, seed=args.seed)
    generator = torch.Generator().manual_seed(args.seed)

    def subset(x, y, n):
        if n and n < x.shape[0]:
            idx = torch.randperm(x.shape[0], generator=generator)[:n]
            x, y = x[idx], y[idx]
        size = x.shape[-1]
        pad = (32 - size) // 2
        return F.pad(x, (pad, 32 - size - pad, pad, 32 - size - pad)).contiguous(), y

    return (*subset(data.x_train, data.y_train, args.train_size), *subset(data.x_test, data.y_test, args.test_size))


def milestones(args):
    """``--milestones``, or the paper's 60/120/160 of 200 epochs scaled to ``--epochs``."""
    if args.milestones is not None:
        return sorted(args.milestones)
    return sorted({max(1, round(args.epochs * m / 200)) for m in (60, 120, 160)})


def optimization(args):
    """``(optimizer factory, scheduler factory or None)`` for ``train()`` and the dense loop alike."""
    gate_lr = args.lr if args.gate_lr is None else args.gate_lr
    if args.optimizer == "adam":
        return (lambda m: torch.optim.Adam(parameter_groups(m, gates={"lr": gate_lr}), lr=args.lr)), None

    def sgd(model):
        groups = parameter_groups(model, gates={"lr": gate_lr, "weight_decay": 0.0})
        return torch.optim.SGD(
            groups, lr=args.lr, momentum=args.momentum, nesterov=True, weight_decay=args.weight_decay
        )

    def schedule(optimizer):
        return torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=milestones(args), gamma=args.gamma)

    return sgd, schedule


def error_rate(net, x, y, batch_size=200):
    net.eval()
    with torch.no_grad():
        wrong = sum(
            int((net(x[i : i + batch_size]).argmax(-1) != y[i : i + batch_size]).sum())
            for i in range(0, len(x), batch_size)
        )
    return wrong / len(x)


def train_dense(args, x, y, x_test, y_test):
    """The dense baseline with the same optimiser, minibatches and number of steps as ``train()``."""
    torch.manual_seed(args.seed)
    net = WideResNet(args.depth, args.width, num_classes=10, in_channels=1)
    make_optimizer, make_schedule = optimization(args)
    optimizer = make_optimizer(net)
    schedule = make_schedule(optimizer) if make_schedule else None
    shuffle = torch.Generator().manual_seed(args.seed)
    history = []
    for epoch in range(args.epochs):
        net.train()
        start = time.perf_counter()
        order = torch.randperm(x.shape[0], generator=shuffle)
        for i in range(0, x.shape[0], args.batch_size):
            idx = order[i : i + args.batch_size]
            optimizer.zero_grad(set_to_none=True)
            F.cross_entropy(net(x[idx]), y[idx]).backward()
            optimizer.step()
        lr = optimizer.param_groups[0]["lr"]  # that of this epoch
        if schedule is not None:
            schedule.step()
        wall = time.perf_counter() - start
        record = {"epoch": epoch + 1, "test_error": error_rate(net, x_test, y_test), "wall_s": wall, "lr": lr}
        history.append(record)
        print(f"dense epoch {epoch + 1}: test error {history[-1]['test_error']:.4f} ({wall:.0f} s)", flush=True)
    return net, history


def train_l0(args, run, x, y, x_test, y_test, out):
    torch.manual_seed(args.seed)
    net = l0_wide_resnet(args.depth, args.width, num_classes=10, in_channels=1, init_drop_rate=args.init_drop_rate)
    model = SparseClassifier(net, lam=args.lam if run == "penalized" else 0.0)
    make_optimizer, make_schedule = optimization(args)
    result = train(
        model,
        x,
        y,
        objective=Constrained(target_density=args.target) if run == "constrained" else run,
        epochs=args.epochs,
        batch_size=args.batch_size,
        lr=args.lr,
        optimizer=make_optimizer,
        scheduler=make_schedule,
        device="cpu",
        seed=args.seed,
        test_data=(x_test, y_test),
        callbacks=[ExpectedFlops((1, 32, 32))],  # Fig. 4: the expected FLOPs in every record
        progress=False,
        checkpoint=str(out / "checkpoint.pt"),  # holds the history so far after every epoch
        threads=None,  # the count of --threads
    )
    for record in result.history:
        print(
            f"{run} epoch {record['epoch']}: test error {record['test_error']:.4f}, "
            f"expected FLOPs {record['expected_flops']:.4g}, gates {record['active_gates']} ({record['wall_s']:.0f} s)",
            flush=True,
        )
    return net.eval(), result.history


def export(net, pruned, path):
    """Save ``pruned`` with torch.export, load it back and check it against the gated ``net``."""
    example = torch.randn(8, 1, 32, 32, generator=torch.Generator().manual_seed(1))
    torch.export.save(torch.export.export(pruned, (example,)), str(path))
    loaded = torch.export.load(str(path)).module()
    with torch.no_grad():
        return float((loaded(example) - net(example)).abs().max())


def run_one(args, run, out, data):
    x, y, x_test, y_test = data
    start = time.perf_counter()
    if run == "dense":
        net, history = train_dense(args, x, y, x_test, y_test)
        torch.save(net.state_dict(), out / "model.pt")
        summary = {"flops": flops(net, (1, 32, 32)), "test_error": history[-1]["test_error"]}
    else:
        net, history = train_l0(args, run, x, y, x_test, y_test, out)
        torch.save(net.state_dict(), out / "model.pt")
        pruned = prune(net)
        summary = {
            **densities(net),
            "architecture": architecture(net),
            "flops": flops(net, (1, 32, 32)),
            "flops_pruned": flops(pruned, (1, 32, 32)),
            "expected_flops": history[-1]["expected_flops"],
            "test_error": history[-1]["test_error"],
            "test_error_pruned": error_rate(pruned, x_test, y_test),
            "export_max_abs_diff": export(net, pruned, out / "pruned.pt2"),
        }
    summary["wall_s"] = time.perf_counter() - start
    (out / "history.json").write_text(json.dumps(history, indent=1))
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    return history, summary


def densities(net):
    """Expected (Eq. 12) and test-time (Eq. 13) fraction of the gated parameters that are kept."""
    with torch.no_grad():
        return {"expected_density": float(expected_density(net).detach()), "test_time_density": test_time_density(net)}


def load_run(run_dir):
    """``(history, summary)`` of a finished run; the densities are recomputed from ``model.pt`` if missing."""
    history = json.loads((run_dir / "history.json").read_text())
    summary = json.loads((run_dir / "summary.json").read_text())
    if "architecture" in summary and "expected_density" not in summary:
        run_args = json.loads((run_dir / "args.json").read_text())
        net = l0_wide_resnet(run_args["depth"], run_args["width"], num_classes=10, in_channels=1)
        net.load_state_dict(torch.load(run_dir / "model.pt", weights_only=True))
        summary.update(densities(net))
    return history, summary


def table(summaries):
    lines = [
        "| run | test error | architecture (open gates per block) | density E / test | FLOPs | FLOPs pruned | E[FLOPs] "
        "| wall |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for run, s in summaries.items():
        pruned, expected = s.get("flops_pruned", s["flops"]), s.get("expected_flops", s["flops"])
        density = f"{s['expected_density']:.3f} / {s['test_time_density']:.3f}" if "expected_density" in s else "-"
        lines.append(
            f"| {run} | {s['test_error']:.4f} | {s.get('architecture', '-')} | {density} | {s['flops'] / 1e6:.1f}M | "
            f"{pruned / 1e6:.1f}M | {expected / 1e6:.1f}M | {s['wall_s']:.0f} s |"
        )
    return "\n".join(lines)


def figure(histories, dense_flops, path):
    import matplotlib

    matplotlib.use("Agg")
    from l0bayes.analysis import plot_expected_flops

    l0 = {run: h for run, h in histories.items() if run != "dense"}
    if not l0:
        return
    fig, _ = plot_expected_flops(l0, dense_flops={"dense": dense_flops})
    fig.savefig(path, dpi=120, bbox_inches="tight")


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    out = pathlib.Path(args.out)
    histories, summaries = {}, {}
    if args.summarize_only:
        for run in RUNS:
            if (out / run / "summary.json").exists():
                histories[run], summaries[run] = load_run(out / run)
    else:
        taken = [run for run in args.runs if (out / run).exists()]
        if taken:
            print(f"{out}: runs {taken} exist already; choose another --out", file=sys.stderr)
            return 2
        out.mkdir(parents=True, exist_ok=True)
        data = load(args)
        for run in args.runs:
            (out / run).mkdir()
            (out / run / "args.json").write_text(json.dumps(vars(args), indent=1))
            histories[run], summaries[run] = run_one(args, run, out / run, data)
    print(table(summaries))
    dense_flops = flops(WideResNet(args.depth, args.width, in_channels=1), (1, 32, 32))
    figure(histories, dense_flops, out / "flops.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
